"""The store's tables as the pre-Alembic SQLite schema left them (its version 3).

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    """Create threads, messages, cells, processed, usage and turns_in_flight."""
    op.create_table(
        "threads",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("channel_key", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("last_active_at", sa.Float, nullable=False),
        sa.Column("last_seq", sa.Integer, nullable=False, server_default="0"),
    )
    for table, columns in (
        (
            "messages",
            [
                sa.Column("role", sa.Text, nullable=False),
                sa.Column("content", sa.Text, nullable=False),
                sa.Column("user_id", sa.Text),
            ],
        ),
        (
            "cells",
            [
                sa.Column("code", sa.Text, nullable=False),
                sa.Column("outputs", sa.Text, nullable=False),
                sa.Column("execution_count", sa.Integer),
                sa.Column("outcome", sa.Text, nullable=False),
                sa.Column("duration_s", sa.Float, nullable=False),
            ],
        ),
    ):
        op.create_table(
            table,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("thread", sa.Text, sa.ForeignKey("threads.key", ondelete="CASCADE"), nullable=False),
            sa.Column("seq", sa.Integer, nullable=False),
            *columns,
            sa.Column("created_at", sa.Float, nullable=False),
            sa.UniqueConstraint("thread", "seq"),
        )
    op.create_table(
        "processed",
        sa.Column("message_id", sa.Text, primary_key=True),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_index("processed_at", "processed", ["at"])
    op.create_table(
        "usage",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("thread", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_index("usage_thread", "usage", ["thread"])
    op.create_table(
        "turns_in_flight",
        sa.Column("thread", sa.Text, primary_key=True),
        sa.Column("message_id", sa.Text, primary_key=True),
        sa.Column("run", sa.Text, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    """Drop every table."""
    for table in ("turns_in_flight", "usage", "processed", "cells", "messages", "threads"):
        op.drop_table(table)
