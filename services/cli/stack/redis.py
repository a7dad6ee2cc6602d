"""Redis: Debian's redis-server, an instance and data directory of its own."""

from __future__ import annotations

import shutil
import subprocess

from services.cli.stack.common import (
    StackError,
    _pid_alive,
    _read_pid,
    _refuse_taken_port,
    _stop_pid,
    _wait_until,
)
from shared.settings import Settings

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
