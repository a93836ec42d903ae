"""The ``mcp.<name>`` section of the config (a public contract, like every key)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

#: What a server's name may look like: it starts every tool name the model sees
#: (``<server>__<tool>``), so it holds no ``__`` and does not end in ``_``.
NAME_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9_-]{0,30}[A-Za-z0-9-])?$"
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def valid_server_name(name: str) -> bool:
    """Whether ``name`` can name an MCP server (see :data:`NAME_PATTERN`)."""
    return re.match(NAME_PATTERN, name) is not None and "__" not in name


class McpServerSettings(BaseModel):
    """One MCP server channels may be granted: over streamable HTTP (``url``) or started by
    the bot and spoken to over stdio (``command``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The streamable HTTP endpoint (``https://host/mcp``). Never shown to the model, a kernel
    #: or the chat (it may carry a key).
    url: SecretStr | None = None
    #: Sent with every request to ``url`` (``Authorization: Bearer ${TOKEN}``); never shown.
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    #: The program of a stdio server (started by the bot, outside the kernels' sandbox).
    command: str | None = None
    args: tuple[str, ...] = ()
    #: A stdio server's environment, over a minimal PATH/HOME/LANG (docs/mcp.md); never shown.
    env: dict[str, SecretStr] = Field(default_factory=dict)
    #: Told to the model with each of the server's tools: what the server is for.
    description: str = Field("", max_length=1000)
    #: The tools offered (by the server's names for them); default: every tool the server does
    #: not annotate as destructive.
    tools: tuple[str, ...] | None = None
    #: Each call stops after this long (the model is told; the turn goes on).
    timeout_s: float = Field(60.0, gt=0, le=3600)

    @field_validator("url")
    @classmethod
    def _an_http_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        try:
            parts = urlsplit(value.get_secret_value())
        except ValueError:  # its message would quote the URL
            raise ValueError("must be an http:// or https:// URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL such as https://host/mcp")
        return value

    @field_validator("headers")
    @classmethod
    def _header_names(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, header in value.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not an HTTP header name")
            if any(c in header.get_secret_value() for c in "\r\n\0"):
                raise ValueError(f"the value of {name} holds a line break")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, item in value.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if "\0" in item.get_secret_value():
                raise ValueError(f"the value of {name} holds a NUL byte")
        return value

    @field_validator("command")
    @classmethod
    def _a_command(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "\0" in value):
            raise ValueError("must name a program")
        return value

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and any(not name for name in value):
            raise ValueError("a tool name cannot be empty")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSettings:
        if (self.url is None) == (self.command is None):
            raise ValueError("set either url (streamable HTTP) or command (stdio)")
        if self.url is not None and (self.args or self.env):
            raise ValueError("args and env belong to a stdio server (command), not to one with a url")
        if self.command is not None and self.headers:
            raise ValueError("headers belong to a server with a url, not to a stdio server (command)")
        return self

    def secrets(self) -> list[str]:
        """Every value of this entry that must never be shown: the URL (and its password and
        query values), each header's value, each environment value."""
        found = [header.get_secret_value() for header in self.headers.values()]
        found += [item.get_secret_value() for item in self.env.values()]
        if self.url is not None:
            url = self.url.get_secret_value()
            found.append(url)
            parts = urlsplit(url)
            if parts.password:
                found.append(parts.password)
            found += [pair.partition("=")[2] for pair in parts.query.split("&") if "=" in pair]
        # "Bearer abc…": the credentials alone too, as a server might echo them without the scheme.
        found += [header.get_secret_value().partition(" ")[2].strip() for header in self.headers.values()]
        return [secret for secret in found if len(secret) >= MIN_SECRET]


#: Values shorter than this are not hidden by value (they would match ordinary words).
MIN_SECRET = 6
