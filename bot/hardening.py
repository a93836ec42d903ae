"""Defence in depth for the bot's own process, whatever the kernel sandbox.

Once the config is read nothing needs the secrets in the environment, so :func:`harden`
drops them from ``os.environ`` (no child process inherits them, no library finds them
later) and makes the process non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``): a process of
the same uid, such as a kernel under ``kernels.sandbox: none``, can then read neither
``/proc/<bot>/environ`` (which keeps the environment the process started with, whatever
``os.environ`` says now) nor the bot's memory (``/proc/<bot>/mem``, ptrace). Root can still
do both: keeping kernels from being root is the sandbox's job.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Iterable, Iterator, MutableMapping
from urllib.parse import urlsplit

from pydantic import BaseModel, SecretStr

from bot.config import Settings

log = logging.getLogger(__name__)

PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3
#: Kept even where the config interpolates them: the process needs them and they hold no secret.
PROCESS_VARIABLES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "PWD",
        "TMPDIR",
        "TERM",
        "LANG",
        "LANGUAGE",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
    }
)
#: Secrets under the names the README documents, dropped even where this config does not use them.
KNOWN_SECRETS = frozenset(
    {
        "OPENAI_API_KEY",
        "SLACK_BOT_TOKEN",
        "SLACK_APP_TOKEN",
        "SLACK_SIGNING_SECRET",
        "DISCORD_BOT_TOKEN",
        "KG_AUTH_TOKEN",
        "THREADBOOK_STORAGE_URL",
    }
)


def secret_values(settings: BaseModel) -> set[str]:
    """Every secret in ``settings`` (each ``SecretStr``, and the password of each one that is a
    URL with a password, e.g. ``storage.url``)."""
    found: set[str] = set()
    for value in _walk(settings):
        secret = value.get_secret_value()
        if not secret:
            continue
        found.add(secret)
        try:
            password = urlsplit(secret).password
        except ValueError:
            password = None
        if password:
            found.add(password)
    return found


def _walk(value: object) -> Iterator[SecretStr]:
    if isinstance(value, SecretStr):
        yield value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _walk(getattr(value, name))
    elif isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _walk(item)


def drop_secrets(
    settings: Settings, referenced: Iterable[str], environ: MutableMapping[str, str] = os.environ
) -> list[str]:
    """Remove from ``environ`` every variable the config refers to (``referenced``), every one
    named in :data:`KNOWN_SECRETS` and every one whose value is a secret of ``settings``, but
    never one of :data:`PROCESS_VARIABLES`. Returns the names removed, sorted."""
    secrets = secret_values(settings)
    doomed = (set(referenced) | KNOWN_SECRETS) - PROCESS_VARIABLES
    names = sorted(
        name
        for name, value in environ.items()
        if name not in PROCESS_VARIABLES and (name in doomed or value in secrets)
    )
    for name in names:
        del environ[name]
    return names


def make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)`` on this process; False (with a warning) where it fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("could not make the bot non-dumpable: %s", os.strerror(ctypes.get_errno()))
        return False
    return True


class HardeningError(Exception):
    """The bot cannot protect its own memory here; ``str()`` is the one line to print."""


def harden(settings: Settings, referenced: Iterable[str]) -> None:
    """Drop the secrets from this process's environment and make it non-dumpable (call once,
    right after the config is read, before anything starts). Fails closed: raises
    :class:`HardeningError` when the process cannot be made non-dumpable, since a kernel of
    the same user could then read the bot's memory and its secrets."""
    dropped = drop_secrets(settings, referenced)
    if not make_undumpable():
        raise HardeningError(
            "cannot make the bot non-dumpable (prctl PR_SET_DUMPABLE failed), so a kernel of the same user "
            "could read its memory and secrets: run Threadbook on Linux, in a container that allows prctl"
        )
    log.info("secrets out of the environment (%d variable(s) removed); process not dumpable", len(dropped))
