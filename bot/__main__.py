"""Command line: ``python -m bot run|console --config FILE``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from bot.config import ConfigError, Settings, load_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bot", description="Threadbook: a code interpreter in chat threads.")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run every chat platform whose token is set")
    run.add_argument("--config", default="config.yaml", help="config file (default config.yaml)")
    console = commands.add_parser("console", help="chat with the bot in this terminal (or through a pipe)")
    console.add_argument("--config", default="config.yaml", help="config file (default config.yaml)")
    console.add_argument("--out", default="out", type=Path, help="where images and files are saved (default ./out)")
    console.add_argument("--thread", default=None, help="resume the console thread with this name")
    return parser


async def _console(settings: Settings, out: Path, thread: str | None) -> int:
    from adapters.console import ConsoleAdapter
    from bot.app import Core, tell_interrupted

    async with Core.open(settings) as core:
        console = ConsoleAdapter(core.dispatcher, out_dir=out, thread=thread)
        # A resumed --thread whose last turn was cut off by an unclean stop hears it first;
        # other threads' leftovers stay for their own resumption or platform.
        await tell_interrupted(core.store, [console])
        await console.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # One line per HTTP request or scheduler job at INFO drowns what the bot itself says.
    for chatty in ("httpx", "httpx2", "apscheduler"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
    if args.command == "console":
        # The console's stdout is the conversation; keep library chatter off it and quiet.
        logging.getLogger().setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.command == "console":
        return asyncio.run(_console(settings, args.out, args.thread))
    from bot.app import run_bot

    return asyncio.run(run_bot(settings))


if __name__ == "__main__":
    sys.exit(main())
