"""The store's schema: migrated by Alembic at open, under an advisory lock on PostgreSQL (so
replicas starting together migrate once); an SQLite file from before Alembic is upgraded in place."""

from __future__ import annotations

import logging
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from bot.migrations import legacy

log = logging.getLogger(__name__)

_MIGRATIONS_DIR = Path(__file__).parent.parent / "migrations"

#: The Alembic revision this code writes (the newest in ``bot/migrations/versions``).
SCHEMA_VERSION = "0006"

#: Any number: the key of the PostgreSQL advisory lock held while migrating.
_MIGRATION_LOCK = 0x7468726561640001


class StoreError(Exception):
    """The database cannot be used by this version of the bot (the message says why)."""


def migrate(conn: Connection) -> None:
    """Bring the database to :data:`SCHEMA_VERSION` (in the caller's transaction)."""
    if conn.dialect.name == "postgresql":
        # Replicas starting together: one migrates, the others wait here, then find nothing to do.
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
    elif not sa.inspect(conn).has_table("alembic_version"):
        _upgrade_legacy_sqlite(conn)
    config = _alembic_config(conn)
    current = MigrationContext.configure(conn).get_current_revision()
    known = {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}
    if current is not None and current not in known:
        raise StoreError(
            f"the database has schema revision {current}, which this bot does not know (it knows up to "
            f"{SCHEMA_VERSION}): run a newer Threadbook, or a database of its own"
        )
    command.upgrade(config, "head")


def current_revision(conn: Connection) -> str:
    """The Alembic revision of the database ``conn`` is connected to."""
    return str(MigrationContext.configure(conn).get_current_revision())


def _alembic_config(conn: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS_DIR))
    config.attributes["connection"] = conn
    return config


def _upgrade_legacy_sqlite(conn: Connection) -> None:
    """An SQLite file from before Alembic (``PRAGMA user_version`` 1–3): finish its old
    migrations, then stamp it with revision ``0001``, which is that schema."""
    version = int(conn.exec_driver_sql("PRAGMA user_version").scalar() or 0)
    if version == 0:
        return  # a new file
    if version > legacy.LAST_VERSION:
        raise StoreError(f"the database has schema version {version}, newer than this bot knows")
    for statements in legacy.MIGRATIONS[version:]:
        for statement in statements:
            conn.exec_driver_sql(statement)
    conn.exec_driver_sql("PRAGMA user_version = 0")  # Alembic's table is the version from now on
    command.stamp(_alembic_config(conn), "0001")
    log.info("upgraded the store from its pre-Alembic schema version %d", version)
