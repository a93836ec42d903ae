"""Discord adapter (discord.py): a mention opens a thread with its own kernel session."""

from adapters.discord.adapter import DiscordAdapter, DiscordStartError

__all__ = ["DiscordAdapter", "DiscordStartError"]
