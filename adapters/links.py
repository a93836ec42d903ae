"""What a link may become in a message on any platform (pure, no I/O).

A link opens only ``http``, ``https`` or ``mailto`` targets (:func:`allowed_target`); any other
target (``!channel``, ``@U123``, ``javascript:``, a relative path) leaves its label as plain
text. A label that reads as an address (a URL, a host, an e-mail address) other than the link's
target is :func:`disguised`: each platform's renderer shows the target instead, so what a
reader sees is where the link goes (:mod:`adapters.slack.format`, :mod:`adapters.slack.render`,
:mod:`adapters.discord.render`).
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import urlsplit

_ALLOWED_TARGET = re.compile(r"^(?:https?://[^\s/?#]+|mailto:[^\s@]+@[^\s@]+)", re.IGNORECASE)
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
#: A label that reads as an address: a URL, ``www.x.org/...``, ``host.example.com``, ``a@b.org``.
_ADDRESS = re.compile(
    r"^(?:[a-z][a-z0-9+.-]*:/*)?(?:[^\s@/]+@)?(?:[a-z0-9-]+\.)+[a-z][a-z0-9-]*\.?(?::\d+)?(?:[/?#]\S*)?$",
    re.IGNORECASE,
)
#: Markup a label may wrap an address in: emphasis, code, escapes, brackets.
_MARKUP = str.maketrans("", "", "*_~`\\[]")
#: Full stops other than ``.`` that browsers (IDNA) read as one in a host name.
_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


def allowed_target(target: str) -> bool:
    """True for an ``http(s)://host…`` or ``mailto:name@host`` target."""
    return bool(_ALLOWED_TARGET.match(target.strip()))


def looks_like_address(label: str) -> bool:
    """True when ``label`` reads as a URL, a host name or an e-mail address, as a reader sees
    it: markup (``**``, ``_``, backticks, ``\\``, brackets), invisible format characters and
    look-alike full stops and letters (NFKC) aside."""
    text = _as_read(label, markup=True).strip().strip("<>")
    return bool(_SCHEME.match(text) and not text.lower().startswith("mailto:") and " " not in text) or bool(
        _ADDRESS.match(text.removeprefix("mailto:"))
    )


def same_address(label: str, target: str) -> bool:
    """True when the address ``label`` shows is ``target`` (scheme, ``www.``, case of the host
    and a trailing slash aside), read with or without the markup around it."""
    target = _normal(target)
    return _normal(_as_read(label, markup=True)) == target or _normal(_as_read(label, markup=False)) == target


def disguised(label: str, target: str) -> bool:
    """True when the label reads as an address other than the target."""
    return looks_like_address(label) and not same_address(label, target)


def _as_read(label: str, *, markup: bool) -> str:
    """``label`` as it reads: NFKC-folded, without format characters (zero-width, bidi), every
    full stop a ``.``, and (``markup``) without the characters Markdown marks text up with."""
    text = unicodedata.normalize("NFKC", label).translate(_DOTS)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return text.translate(_MARKUP) if markup else text


def _normal(address: str) -> str:
    text = address.strip().strip("<>").removeprefix("mailto:").removeprefix("MAILTO:")
    if "://" not in text and "@" not in text:
        text = "http://" + text
    if "@" in text and "://" not in text:
        return text.lower()
    try:
        parts = urlsplit(text)
    except ValueError:  # not a URL Python can read (a bracketed host that is no IP): as written
        return text.lower()
    host = (parts.hostname or "").lower().removeprefix("www.").rstrip(".")
    try:
        port = f":{parts.port}" if parts.port and parts.port not in (80, 443) else ""
    except ValueError:  # a port that is not a number: compared as written
        port = parts.netloc
    rest = (
        parts.path.rstrip("/")
        + (f"?{parts.query}" if parts.query else "")
        + (f"#{parts.fragment}" if parts.fragment else "")
    )
    user = f"{parts.username}@" if parts.username else ""
    return f"{user}{host}{port}{rest}"
