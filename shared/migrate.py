"""Run Alembic migrations programmatically (the CLI, the launcher and the tests use this)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from shared.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def alembic_config(settings: Settings) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", settings.postgres_dsn().replace("%", "%%"))
    return cfg


def upgrade_head(settings: Settings) -> None:
    command.upgrade(alembic_config(settings), "head")
