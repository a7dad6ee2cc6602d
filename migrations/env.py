"""Alembic environment: the database URL comes from Concord's settings, never from the ini."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from shared.models import Base
from shared.settings import get_settings

target_metadata = Base.metadata

# The partitions of ``chunks`` (migration 0013): the shared DEFAULT one and each large tenant's
# own, made at run time (shared/stores/partitions.py). The models describe the parent only.
CHUNK_PARTITIONS = ("chunks_shared", "chunks_t_")


def include_object(obj: object, name: str | None, type_: str, reflected: bool, _: object) -> bool:
    if type_ == "table" and reflected and name is not None:
        return not name.startswith(CHUNK_PARTITIONS)
    return True


def _url() -> str:
    return context.config.get_main_option("sqlalchemy.url") or get_settings().postgres_dsn()


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        include_object=include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=target_metadata, include_object=include_object
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
