"""Scheduled analyses: a question a thread asks again at the times of a cron rule.

Revision ID: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    """Add the schedules table and the index the scheduler polls."""
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("thread", sa.Text, nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("creator", sa.Text, nullable=False),
        sa.Column("creator_name", sa.Text, nullable=False),
        sa.Column("question", sa.Text, nullable=False),
        sa.Column("cron", sa.Text, nullable=False),
        sa.Column("timezone", sa.Text, nullable=False),
        sa.Column("described", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("next_run_at", sa.Float),
        sa.Column("last_run_at", sa.Float),
        sa.Column("disabled_reason", sa.Text),
        sa.UniqueConstraint("thread", "number", name="schedules_thread_number"),
    )
    op.create_index("schedules_next_run_at", "schedules", ["next_run_at"])


def downgrade() -> None:
    """Drop the schedules table."""
    op.drop_index("schedules_next_run_at", "schedules")
    op.drop_table("schedules")
