"""Slack's agent messaging: whom the Messages tab has greeted, and the channel a direct
message thread took its policy from.

Revision ID: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    """Add the greetings table and threads.viewed_channel."""
    op.create_table(
        "greetings",
        sa.Column("platform", sa.Text, primary_key=True),
        sa.Column("workspace", sa.Text, primary_key=True),
        sa.Column("user_id", sa.Text, primary_key=True),
        sa.Column("at", sa.Float, nullable=False),
    )
    with op.batch_alter_table("threads") as batch:
        batch.add_column(sa.Column("viewed_channel", sa.Text))


def downgrade() -> None:
    """Drop them."""
    with op.batch_alter_table("threads") as batch:
        batch.drop_column("viewed_channel")
    op.drop_table("greetings")
