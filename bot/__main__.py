"""Command line: ``python -m bot run|console --config FILE``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from logging.handlers import RotatingFileHandler
from pathlib import Path

from bot import logs
from bot.config import ConfigError, Settings, load_settings
from bot.hardening import HardeningError, harden
from bot.store import StoreError
from kernels import SandboxUnavailableError

LOG_FORMAT = logs.TEXT_FORMAT
#: The interactive console's log, beside the SQLite store (in ``data/`` with PostgreSQL).
CONSOLE_LOG_NAME = "threadbook-console.log"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bot", description="Threadbook: a code interpreter in chat threads."
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run every chat platform whose token is set")
    run.add_argument("--config", default="config.yaml", help="config file (default config.yaml)")
    console = commands.add_parser("console", help="chat with the bot in this terminal (or through a pipe)")
    console.add_argument("--config", default="config.yaml", help="config file (default config.yaml)")
    console.add_argument("--out", default="out", type=Path, help="where images and files are saved (default ./out)")
    console.add_argument("--thread", default=None, help="resume the console thread with this name")
    console.add_argument(
        "--quiet", action="store_true", help="do not show the code that runs and its output (one line per step)"
    )
    return parser


def _console_logging(settings: Settings) -> Path | None:
    """Keep log lines out of the console's conversation; returns the log file, if one is used.

    With answers on a terminal, stderr is the same screen, so every log line (at --log-level)
    goes to a rotating file beside the store and the console names it once, as ollama and npm
    do with theirs; what a person must act on is already said in the conversation. Through a
    pipe, stdout carries only answers and ``saved:`` lines, and stderr keeps WARNING and above
    for the script's own log.
    """
    root = logging.getLogger()
    if sys.stdout.isatty():
        store_file = settings.storage.sqlite_path or Path("data") / "threadbook.db"
        path = (store_file.parent / CONSOLE_LOG_NAME).resolve()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = RotatingFileHandler(path, maxBytes=5 * 2**20, backupCount=2, encoding="utf-8")
        except OSError as exc:
            print(f"threadbook: cannot write the log {path} ({exc.strerror}); warnings go to stderr", file=sys.stderr)
        else:
            handler.setFormatter(logs.formatter(settings.logging.format))
            for old in root.handlers[:]:
                root.removeHandler(old)
            root.addHandler(handler)
            logging.captureWarnings(True)  # Python's warnings too would print between the answers
            return path
    root.setLevel(max(logging.WARNING, root.level))
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    # One line per HTTP request or scheduler job at INFO drowns what the bot itself says.
    for chatty in ("httpx", "httpx2", "apscheduler", "alembic"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
    referenced: set[str] = set()
    try:
        settings = load_settings(args.config, referenced=referenced)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    # logging.format (text or json); lines logged while a message is handled name its thread and turn.
    logs.use_format(settings.logging.format)
    log_path = _console_logging(settings) if args.command == "console" else None
    # From here on no secret is in the environment and no same-uid process can read ours.
    try:
        harden(settings, referenced)
    except HardeningError as exc:
        print(f"threadbook: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "console":
            from bot.app import run_console

            return asyncio.run(run_console(settings, args.out, args.thread, log_path, quiet=args.quiet))
        from bot.app import run_bot

        return asyncio.run(run_bot(settings))
    except (StoreError, SandboxUnavailableError) as exc:
        print(f"threadbook: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C outside the console's own handling (start-up, shutdown): asyncio.run has
        # already cancelled the work and run its clean-up; no traceback for that.
        return 130


if __name__ == "__main__":
    sys.exit(main())
