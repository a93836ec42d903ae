"""Discord application (slash) commands: ``/help``, ``/reset``, ``/files``, ``/export``,
``/status``, ``/usage``, ``/schedule`` and ``/ask``.

The commands only translate: each one's callback hands the interaction to a
:class:`SlashHandler` (the adapter), which acknowledges it at once (Discord allows 3 seconds)
and does the work afterwards. The in-thread commands become the same words the dispatcher
already understands as messages (``export html`` for ``/export format:html``, ``usage all``
for ``/usage everyone:true``, ``schedule every monday 9:00 …`` for ``/schedule request:…``,
``schedules`` for a bare ``/schedule``, ``unschedule 2`` for ``/schedule remove:2``).
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Protocol

import discord
from discord import app_commands

log = logging.getLogger(__name__)

#: Slash command → (what it does, the message text the dispatcher gets).
IN_THREAD: dict[str, tuple[str, str]] = {
    "help": ("What Threadbook does and which commands it knows", "help"),
    "reset": ("A fresh Python kernel for this thread (variables cleared, files kept)", "reset"),
    "files": ("List the files in this thread's workspace", "files"),
    "status": ("Kernel state, memory, saved variables, steps run and tokens used", "status"),
}
FAILED = "⚠️ Something went wrong on my side with that command. Please try again."


class SlashHandler(Protocol):
    """Where the commands' interactions go."""

    async def in_thread(self, interaction: discord.Interaction, text: str) -> None:
        """Run the in-thread command ``text`` (``help``, ``export html``, …) for the interaction's thread."""

    async def ask(self, interaction: discord.Interaction, question: str, attachment: discord.Attachment | None) -> None:
        """Open a thread (or use the current one) for ``question`` and answer it there."""


class CommandTree(app_commands.CommandTree[Any]):
    """discord.py's tree, answering every interaction it cannot run with one sentence."""

    async def on_error(self, interaction: discord.Interaction[Any], error: app_commands.AppCommandError, /) -> None:
        """An unknown command (an outdated registration) or bad options: tell the user."""
        log.warning("Discord command %s failed: %r", interaction.data and interaction.data.get("name"), error)
        try:
            if interaction.response.is_done():
                await interaction.followup.send(FAILED, ephemeral=True)
            else:
                await interaction.response.send_message(FAILED, ephemeral=True)
        except discord.HTTPException as exc:
            log.warning("could not tell the user either: %s", exc)


def build_tree(client: discord.Client, handler: SlashHandler) -> CommandTree:
    """The command tree of ``client`` with Threadbook's commands, all going to ``handler``."""
    tree = CommandTree(client)
    for name, (description, text) in IN_THREAD.items():
        tree.add_command(app_commands.Command(name=name, description=description, callback=_in_thread(handler, text)))

    @tree.command(name="export", description="This thread as a Jupyter notebook (or as HTML)")
    @app_commands.describe(format="ipynb (default): a notebook to open in Jupyter; html: a page to read anywhere")
    async def export(interaction: discord.Interaction, format: Literal["ipynb", "html"] = "ipynb") -> None:
        await handler.in_thread(interaction, "export" if format == "ipynb" else f"export {format}")

    @tree.command(
        name="usage", description="Tokens, Python time and cost of this thread and yours, today and this month"
    )
    @app_commands.describe(everyone="Everyone's usage (for the bot's admins)")
    async def usage(interaction: discord.Interaction, everyone: bool = False) -> None:
        await handler.in_thread(interaction, "usage all" if everyone else "usage")

    @tree.command(name="schedule", description="Ask again at set times; without options, list this thread's schedules")
    @app_commands.describe(
        request="When, then the question: every monday 9:00 revenue by region",
        remove="The number of a schedule to remove (as listed)",
    )
    async def schedule(interaction: discord.Interaction, request: str | None = None, remove: int | None = None) -> None:
        await handler.in_thread(interaction, schedule_text(request, remove))

    @tree.command(name="ask", description="Ask a question: I open a thread with its own Python kernel")
    @app_commands.describe(
        question="What you want to know or have computed", attachment="A file to work with (CSV, Excel, JSON, …)"
    )
    async def ask(
        interaction: discord.Interaction, question: str, attachment: discord.Attachment | None = None
    ) -> None:
        await handler.ask(interaction, question, attachment)

    return tree


def schedule_text(request: str | None, remove: int | None) -> str:
    """The in-thread schedule command a ``/schedule`` interaction stands for."""
    if remove is not None:
        return f"unschedule {remove}"
    request = " ".join((request or "").split())
    return f"schedule {request}" if request else "schedules"


def _in_thread(handler: SlashHandler, text: str) -> Any:
    async def run(interaction: discord.Interaction) -> None:
        await handler.in_thread(interaction, text)

    return run
