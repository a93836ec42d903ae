"""Typed, validated settings loaded once from ``config.yaml``.

Strings may reference the environment as ``${VAR}`` (required) or ``${VAR:-default}``.
Any problem stops start-up with one line that names the key (and the variable).
Settings are passed down explicitly; nothing deeper in the code reads the environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from bot.mcp.settings import McpServerSettings, valid_server_name
from bot.sources.settings import NAME_PATTERN, SourceSettings
from kernels import KernelSettings

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(Exception):
    """A configuration problem, phrased as one line that names the key."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelPrice(_Model):
    """What a model costs, in US dollars per million tokens."""

    input: float = Field(0, ge=0)
    output: float = Field(0, ge=0)


class LLMSettings(_Model):
    """The OpenAI-compatible endpoint (chat completions or the Responses API)."""

    model: str = "gpt-4o-mini"
    base_url: str = "https://api.openai.com/v1"
    api_key: SecretStr = SecretStr("")
    #: Which API the bot speaks: ``chat`` (``/chat/completions``), ``responses`` (``/responses``)
    #: or ``auto`` (api.openai.com: responses; else whichever path the server has, found on first use).
    api: Literal["auto", "chat", "responses"] = "auto"
    max_rounds: int = Field(8, ge=1, le=100)
    request_timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(2, ge=0, le=10)  # for 429/5xx/connection errors; a timeout is retried once at most
    temperature: float | None = Field(None, ge=0, le=2)
    #: Sent on every request (``max_tokens``; ``max_completion_tokens`` to reasoning models;
    #: ``max_output_tokens`` on the Responses API), so a server cannot generate without end;
    #: ``null`` leaves it out.
    max_tokens: int | None = Field(4096, ge=1)
    #: Budget of earlier messages replayed to the model, in characters.
    context_chars: int = Field(48_000, ge=1000)
    #: Price per model (the name as sent, e.g. ``gpt-4o-mini``), for the costs ``usage`` shows.
    prices: dict[str, ModelPrice] = Field(default_factory=dict)


class SuggestedPrompt(_Model):
    """A prompt offered in a new Slack assistant thread: ``title`` is shown, ``message`` is sent."""

    title: str = Field(min_length=1, max_length=75)
    message: str = Field(min_length=1, max_length=4000)


DEFAULT_PROMPTS = (
    SuggestedPrompt(
        title="Summarise a CSV",
        message="Summarise the CSV I'm attaching: columns, types, missing values and anything odd.",
    ),
    SuggestedPrompt(
        title="Chart a trend", message="Plot the monthly totals from the attached file and tell me what stands out."
    ),
    SuggestedPrompt(title="What can you do?", message="help"),
)


class SlackAssistantSettings(_Model):
    """Slack's AI-app surface (assistant threads in the side panel)."""

    greeting: str = (
        "Hi! Attach a file (CSV, Excel, JSON…) and ask me about it: I run Python and answer here, with charts."
    )
    #: At most four (Slack's limit); a channel's ``suggested_prompts`` replace them while the
    #: user views that channel.
    prompts: tuple[SuggestedPrompt, ...] = Field(DEFAULT_PROMPTS, max_length=4)


class SlackSettings(_Model):
    """Slack app credentials and endpoints. Enabled when ``bot_token`` is set."""

    bot_token: SecretStr = SecretStr("")
    app_token: SecretStr = SecretStr("")  # set → Socket Mode, else HTTP Events API
    signing_secret: SecretStr = SecretStr("")
    api_url: str = "https://slack.com/api/"
    http_host: str = "0.0.0.0"
    http_port: int = Field(3000, ge=0, le=65535)
    reply_without_mention: bool = True
    #: Stream answers as the model writes them (Slack's chat streaming, or an edited message
    #: where Slack refuses it).
    streaming: bool = True
    #: Seconds a turn runs before its status (the message with the Stop button, the agent
    #: session, the assistant status line) shows; a quicker turn shows only :eyes: and ✅.
    status_after_s: float = Field(1.0, ge=0, le=30)
    assistant: SlackAssistantSettings = Field(default_factory=SlackAssistantSettings)

    @property
    def enabled(self) -> bool:
        """True when a bot token is configured."""
        return bool(self.bot_token.get_secret_value())


class DiscordSettings(_Model):
    """Discord bot credentials and endpoints. Enabled when ``token`` is set."""

    token: SecretStr = SecretStr("")
    api_url: str | None = None  # REST base, e.g. http://127.0.0.1:8080/api/v10
    gateway_url: str | None = None  # e.g. ws://127.0.0.1:8080/gateway
    upload_limit_mb: float = Field(10.0, gt=0)
    #: Sharding across replicas: the total number of shards, and the ones this replica runs
    #: (all of them when unset). Unset count: one shard, or Discord's recommendation with ids.
    shard_count: int | None = Field(None, ge=1)
    shard_ids: tuple[int, ...] | None = None
    #: Guilds whose slash commands are registered directly (updates show at once); empty: the
    #: commands are registered globally (every guild and DMs; Discord may take a while to show them).
    guild_ids: list[int] = Field(default_factory=list)
    #: Forum channels where every new post is a session of its own, mention or not (in other
    #: forums a post must mention the bot).
    forum_channels: list[int] = Field(default_factory=list)

    @property
    def enabled(self) -> bool:
        """True when a bot token is configured."""
        return bool(self.token.get_secret_value())

    @model_validator(mode="after")
    def _shards(self) -> DiscordSettings:
        if self.shard_ids is not None:
            if self.shard_count is None:
                raise ValueError("shard_ids needs shard_count (the total number of shards of every replica)")
            if not self.shard_ids or any(not 0 <= i < self.shard_count for i in self.shard_ids):
                raise ValueError(f"shard_ids must be between 0 and shard_count - 1 ({self.shard_count - 1})")
        return self


class StorageSettings(_Model):
    """The store: an SQLite file (one replica) or a PostgreSQL database shared by replicas."""

    #: ``sqlite:///data/threadbook.db`` or ``postgresql://user:pass@host/db``; unset: ``path``.
    url: SecretStr | None = None
    #: The SQLite file when ``url`` is unset (the setting before ``url`` existed).
    path: Path = Path("data/threadbook.db")
    #: A replica that has not shown signs of life for this long is gone: the turns it was
    #: running are reported interrupted and its threads go to the others.
    replica_timeout_s: float = Field(15.0, ge=1, le=3600)

    @property
    def resolved_url(self) -> str:
        """The store's URL: ``url``, or ``sqlite:///`` + ``path``."""
        return self.url.get_secret_value() if self.url is not None else f"sqlite:///{self.path}"

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite file of the store; None for PostgreSQL."""
        url = self.resolved_url
        return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None

    @model_validator(mode="after")
    def _url_or_path(self) -> StorageSettings:
        if self.url is not None:
            if "path" in self.model_fields_set:
                raise ValueError("set url or path, not both")
            scheme = self.url.get_secret_value().partition("://")[0].partition("+")[0]
            if scheme not in ("sqlite", "postgresql", "postgres"):
                raise ValueError("url must start with sqlite:/// or postgresql://")
        return self


class OpsSettings(_Model):
    """How the process runs and stops."""

    #: On SIGTERM, running turns get this long to finish before they are cut off (and told).
    shutdown_grace_s: float = Field(25.0, ge=0, le=3600)
    #: The operations HTTP server of ``run`` (/healthz, /readyz, /metrics; docs/operations.md):
    #: its address, and its port (0: no server).
    http_host: str = "127.0.0.1"
    http_port: int = Field(0, ge=0, le=65535)


class LoggingSettings(_Model):
    """How log lines are written (the level is ``--log-level``)."""

    #: ``text`` (one readable line) or ``json`` (one JSON object a line; docs/operations.md).
    format: Literal["text", "json"] = "text"


class AccessSettings(_Model):
    """Allow-lists (empty means everyone) and the admins."""

    allow_channels: tuple[str, ...] = ()
    allow_users: tuple[str, ...] = ()
    #: Users (platform ids, or ``platform:id``) who may ask for ``usage all``.
    admins: tuple[str, ...] = ()

    def is_admin(self, platform: str, user_id: str) -> bool:
        """Whether ``user_id`` of ``platform`` is listed in ``admins``."""
        return user_id in self.admins or f"{platform}:{user_id}" in self.admins


class Limits(_Model):
    """Budgets; 0 means unlimited. Per day means per calendar day in UTC."""

    tokens_per_user_day: int = Field(0, ge=0)
    tokens_per_channel_day: int = Field(0, ge=0)
    turns_per_user_minute: int = Field(0, ge=0)
    kernel_seconds_per_user_day: float = Field(0, ge=0)

    def over(self, override: Limits | None) -> Limits:
        """These limits with the keys ``override`` sets replaced (a channel's own limits)."""
        if override is None:
            return self
        return self.model_copy(update={name: getattr(override, name) for name in override.model_fields_set})


class ScheduleSettings(_Model):
    """Scheduled analyses (``schedule <when> <question>`` in a thread)."""

    enabled: bool = True
    #: The time zone of a schedule whose author's the platform does not tell (an IANA name).
    timezone: str = "UTC"
    #: Schedules a thread may hold at once.
    max_per_thread: int = Field(5, ge=1, le=100)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r} (an IANA name such as UTC or Europe/Paris)") from None
        return value


class ChannelPolicy(_Model):
    """Per-channel overrides, keyed by ``platform:channel_id`` in ``channels:``."""

    system_prompt: str | None = None
    model: str | None = None
    data_dir: Path | None = None  # offered read-only to this channel's kernels
    network: bool | None = None
    max_rounds: int | None = Field(None, ge=1, le=100)
    #: Let processes a cell starts keep running after it returns (default: they are killed).
    background_processes: bool = False
    #: Offered in a Slack assistant thread opened while viewing this channel (at most four).
    suggested_prompts: tuple[SuggestedPrompt, ...] | None = Field(None, max_length=4)
    #: This channel's budgets: the keys set here replace the global ``limits``.
    limits: Limits | None = None
    #: The ``sources`` this channel's threads may query with the model's ``sql`` tool.
    sources: tuple[str, ...] = ()
    #: The ``mcp`` servers whose tools this channel's threads are offered.
    mcp: tuple[str, ...] = ()

    def in_view_of(self, viewed: ChannelPolicy) -> ChannelPolicy:
        """This (a direct message's) policy with what a viewed channel lends its members' DM
        threads: its system prompt, data folder, data sources and MCP servers. The model, network,
        limits and the rest stay this one's."""
        lent = {"system_prompt": viewed.system_prompt, "data_dir": viewed.data_dir, "sources": viewed.sources}
        return self.model_copy(update={**lent, "mcp": viewed.mcp})

    @field_validator("data_dir")
    @classmethod
    def _data_dir_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"data_dir {str(value)!r} is not a directory")
        return value


class Settings(_Model):
    """The whole configuration."""

    llm: LLMSettings = Field(default_factory=LLMSettings)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    discord: DiscordSettings = Field(default_factory=DiscordSettings)
    kernels: KernelSettings = Field(default_factory=KernelSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    ops: OpsSettings = Field(default_factory=OpsSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    access: AccessSettings = Field(default_factory=AccessSettings)
    limits: Limits = Field(default_factory=Limits)
    schedules: ScheduleSettings = Field(default_factory=ScheduleSettings)
    channels: dict[str, ChannelPolicy] = Field(default_factory=dict)
    #: Databases channels may be granted (``channels.*.sources``), by name.
    sources: dict[str, SourceSettings] = Field(default_factory=dict)
    #: MCP servers channels may be granted (``channels.*.mcp``), by name.
    mcp: dict[str, McpServerSettings] = Field(default_factory=dict)

    @field_validator("sources")
    @classmethod
    def _source_names(cls, value: dict[str, SourceSettings]) -> dict[str, SourceSettings]:
        for name in value:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"source name {name!r} must be letters, digits, '_', '.' or '-' (at most 63)")
        return value

    @field_validator("mcp")
    @classmethod
    def _mcp_names(cls, value: dict[str, McpServerSettings]) -> dict[str, McpServerSettings]:
        for name in value:
            if not valid_server_name(name):
                raise ValueError(
                    f"MCP server name {name!r} must be letters, digits, '-' or single '_' (at most 32, not ending in '_')"
                )
        return value

    @model_validator(mode="after")
    def _granted_sources_exist(self) -> Settings:
        for key, policy in self.channels.items():
            for name in policy.sources:
                if name not in self.sources:
                    raise ValueError(f"channels.{key}.sources names {name!r}, which is not under sources")
            for name in policy.mcp:
                if name not in self.mcp:
                    raise ValueError(f"channels.{key}.mcp names {name!r}, which is not under mcp")
        return self

    @field_validator("channels")
    @classmethod
    def _channel_keys(cls, value: dict[str, ChannelPolicy]) -> dict[str, ChannelPolicy]:
        for key in value:
            platform, sep, channel = key.partition(":")
            if not sep or not platform or not channel:
                raise ValueError(f"channel key {key!r} must look like 'platform:channel_id'")
        return value

    def policy_for(self, channel_key: str) -> ChannelPolicy:
        """The overrides for ``platform:channel`` (empty policy when none)."""
        return self.channels.get(channel_key, ChannelPolicy())


def interpolate(value: Any, env: Mapping[str, str], path: str = "", sources: dict[str, str] | None = None) -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string of a YAML tree.

    ``sources`` (if given) records which variable fed which dotted key, for error messages.
    """
    if isinstance(value, dict):
        return {k: interpolate(v, env, f"{path}.{k}" if path else str(k), sources) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, f"{path}.{i}", sources) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if sources is not None:
            sources[path] = name
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"config: {path}: environment variable {name} is not set")

    return _ENV_REF.sub(substitute, value)


def referenced_variables(value: Any) -> set[str]:
    """Every environment variable a YAML tree refers to (``${VAR}`` or ``${VAR:-default}``)."""
    if isinstance(value, dict):
        return set().union(*(referenced_variables(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(referenced_variables(v) for v in value))
    return {match.group(1) for match in _ENV_REF.finditer(value)} if isinstance(value, str) else set()


def parse_settings(raw: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> Settings:
    """Validate a YAML tree (already loaded) into :class:`Settings`."""
    sources: dict[str, str] = {}
    data = interpolate(dict(raw or {}), os.environ if env is None else env, "", sources)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, sources)) from None
    _check_combinations(settings)
    _check_sources(settings)
    return settings


def _check_sources(settings: Settings) -> None:
    """Every source's SQLAlchemy dialect and driver load (nothing connects): a missing driver
    stops start-up here, not every turn of every channel granted the source."""
    if not settings.sources:
        return
    from bot.sources.engine import SourceUnavailable, check_source  # drivers are loaded only when sources exist

    for name, source in settings.sources.items():
        try:
            check_source(name, source)
        except SourceUnavailable as exc:
            raise ConfigError(f"config: {exc}") from None


def _check_combinations(settings: Settings) -> None:
    """Rules that span several keys, reported like field errors."""
    if "api.openai.com" in settings.llm.base_url and not settings.llm.api_key.get_secret_value():
        raise ConfigError("config: llm.api_key: required for api.openai.com (set OPENAI_API_KEY)")
    slack = settings.slack
    if slack.enabled and not (slack.app_token.get_secret_value() or slack.signing_secret.get_secret_value()):
        raise ConfigError(
            "config: slack.app_token: set it (SLACK_APP_TOKEN, Socket Mode) or slack.signing_secret "
            "(SLACK_SIGNING_SECRET, Events API) together with slack.bot_token"
        )


def load_settings(
    path: str | Path, env: Mapping[str, str] | None = None, *, referenced: set[str] | None = None
) -> Settings:
    """Read, interpolate and validate a config file; ``referenced`` (if given) gets the names
    of the environment variables the file refers to."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config: file {path} not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config: {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"config: {path} must hold a mapping at the top level")
    if referenced is not None:
        referenced.update(referenced_variables(raw))
    return parse_settings(raw, env)


def _one_line(exc: ValidationError, sources: Mapping[str, str]) -> str:
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    var = sources.get(key)
    hint = f" (from environment variable {var})" if var else ""
    more = f" [+{exc.error_count() - 1} more]" if exc.error_count() > 1 else ""
    return f"config: {key or '(top level)'}: {message}{hint}{more}"
