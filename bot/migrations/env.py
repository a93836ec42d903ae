"""Alembic's entry point for the store's migrations: always run by :mod:`bot.store` on a
connection it opened (``config.attributes["connection"]``), inside its transaction."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
