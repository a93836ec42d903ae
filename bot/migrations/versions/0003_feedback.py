"""Feedback on answers: one 👍 or 👎 per person and turn, the latest click counts.

Revision ID: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    """Add the feedback table."""
    op.create_table(
        "feedback",
        sa.Column("thread", sa.Text, primary_key=True),
        sa.Column("turn_id", sa.Text, primary_key=True),
        sa.Column("user_id", sa.Text, primary_key=True),
        sa.Column("good", sa.Boolean, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    """Drop the feedback table."""
    op.drop_table("feedback")
