"""Several replicas on one database: live replicas, per-thread turn tickets, the kernel's owner.

- ``replicas``: each bot process (``run``) and when it last showed signs of life; a replica
  silent past ``storage.replica_timeout_s`` is gone, and the turns it held are interrupted.
- ``threads.last_ticket`` and ``turns_in_flight.ticket``: a thread's turns run one at a time,
  in the order their messages were claimed, whichever replica claimed them.
- ``turns_in_flight.stop_requested``: a Stop button clicked on one replica reaches the turn
  running on another.
- ``threads.kernel_run`` and ``threads.kernel_id``: the replica whose kernel holds the thread's
  live variables, and that kernel's id on a Jupyter gateway (None for a local kernel). Another
  replica that takes the thread drops its own, older kernel; if the owner is gone, it takes
  over the owner's gateway kernel, else it restores the saved variables.

Revision ID: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    """Add the replica table and the ticket and owner columns."""
    op.create_table(
        "replicas",
        sa.Column("run", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("seen_at", sa.Float, nullable=False),
    )
    op.add_column("threads", sa.Column("last_ticket", sa.Integer, nullable=False, server_default="0"))
    op.add_column("threads", sa.Column("kernel_run", sa.Text))
    op.add_column("threads", sa.Column("kernel_id", sa.Text))
    # Turns left by an earlier bot keep ticket 0: ahead of every new one, and reported first.
    op.add_column("turns_in_flight", sa.Column("ticket", sa.Integer, nullable=False, server_default="0"))
    op.add_column("turns_in_flight", sa.Column("stop_requested", sa.Boolean, nullable=False, server_default=sa.false()))
    op.create_index("turns_in_flight_run", "turns_in_flight", ["run"])


def downgrade() -> None:
    """Drop what :func:`upgrade` added."""
    op.drop_index("turns_in_flight_run", "turns_in_flight")
    with op.batch_alter_table("turns_in_flight") as batch:
        batch.drop_column("stop_requested")
        batch.drop_column("ticket")
    with op.batch_alter_table("threads") as batch:
        batch.drop_column("kernel_id")
        batch.drop_column("kernel_run")
        batch.drop_column("last_ticket")
    op.drop_table("replicas")
