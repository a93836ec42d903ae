"""Usage per turn, per person and per channel, with kernel time: what budgets and ``usage`` count.

A turn's row is made when it starts (so ``turns_per_user_minute`` counts it at once) and its
tokens and kernel seconds are added as it ends. Rows from before keep no user; their channel
is taken from their thread's key (``platform:workspace:channel:thread``).

Revision ID: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    """Add the user, channel and kernel-time columns, fill the channels, index what budgets read."""
    op.add_column("usage", sa.Column("user_id", sa.Text))
    op.add_column("usage", sa.Column("channel_key", sa.Text))
    op.add_column("usage", sa.Column("kernel_s", sa.Float, nullable=False, server_default="0"))
    conn = op.get_bind()
    table = sa.table("usage", sa.column("thread", sa.Text), sa.column("channel_key", sa.Text))
    for (thread,) in conn.execute(sa.select(table.c.thread).distinct()).all():
        parts = str(thread).split(":", 3)
        if len(parts) == 4:
            conn.execute(sa.update(table).where(table.c.thread == thread).values(channel_key=f"{parts[0]}:{parts[2]}"))
    op.create_index("usage_user_at", "usage", ["user_id", "at"])
    op.create_index("usage_channel_at", "usage", ["channel_key", "at"])
    op.create_index("usage_at", "usage", ["at"])


def downgrade() -> None:
    """Drop what :func:`upgrade` added."""
    op.drop_index("usage_at", "usage")
    op.drop_index("usage_channel_at", "usage")
    op.drop_index("usage_user_at", "usage")
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("kernel_s")
        batch.drop_column("channel_key")
        batch.drop_column("user_id")
