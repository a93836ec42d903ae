"""The ``mcp`` section and the ``channels.*.mcp`` grants: a bad entry stops start-up with one
line naming the key; credentials are secrets the bot drops from its environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import ConfigError, parse_settings
from bot.hardening import drop_secrets, secret_values


def settings(**raw: Any) -> Any:
    raw.setdefault("llm", {"base_url": "http://127.0.0.1:9/v1"})
    return parse_settings(raw, env={"TRACKER_TOKEN": "tok-123456789", "LOCAL_KEY": "key-abcdef"})


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        ({"mcp": {"t": {}}}, "config: mcp.t: set either url (streamable HTTP) or command (stdio)"),
        ({"mcp": {"t": {"url": "http://h/mcp", "command": "x"}}}, "config: mcp.t: set either url"),
        ({"mcp": {"t": {"url": "ftp://h/mcp"}}}, "config: mcp.t.url: must be an http:// or https:// URL"),
        ({"mcp": {"t": {"url": "http://h/mcp", "env": {"A": "b"}}}}, "config: mcp.t: args and env belong to a stdio"),
        (
            {"mcp": {"t": {"command": "x", "headers": {"A": "b"}}}},
            "config: mcp.t: headers belong to a server with a url",
        ),
        ({"mcp": {"t": {"url": "http://h/mcp", "headers": {"A B": "c"}}}}, "config: mcp.t.headers: 'A B' is not"),
        ({"mcp": {"t": {"command": "x", "env": {"1A": "c"}}}}, "config: mcp.t.env: '1A' is not an environment"),
        ({"mcp": {"t": {"url": "http://h/mcp", "timeout_s": 0}}}, "config: mcp.t.timeout_s: Input should be greater"),
        ({"mcp": {"t": {"url": "http://h/mcp", "tools": [""]}}}, "config: mcp.t.tools: a tool name"),
        ({"mcp": {"t": {"url": "http://h/mcp", "token": "x"}}}, "config: mcp.t.token: unknown key"),
        ({"mcp": {"a__b": {"url": "http://h/mcp"}}}, "config: mcp: MCP server name 'a__b' must be"),
        ({"mcp": {"a_": {"url": "http://h/mcp"}}}, "config: mcp: MCP server name 'a_' must be"),
        (
            {"mcp": {"t": {"url": "http://h/mcp"}}, "channels": {"slack:C1": {"mcp": ["u"]}}},
            "config: (top level): channels.slack:C1.mcp names 'u', which is not under mcp",
        ),
        (
            {"mcp": {"t": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer ${NOT_SET}"}}}},
            "config: mcp.t.headers.Authorization: environment variable NOT_SET is not set",
        ),
    ],
)
def test_a_bad_entry_is_one_line_naming_the_key(raw: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as refused:
        settings(**raw)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(line), message


def test_a_good_config_and_its_grants(tmp_path: Path) -> None:
    parsed = settings(
        mcp={
            "tracker": {
                "url": "https://tracker.example/mcp",
                "headers": {"Authorization": "Bearer ${TRACKER_TOKEN}"},
                "description": "Issues",
                "tools": ["search"],
                "timeout_s": 20,
            },
            "local": {"command": "local-mcp", "args": ["--stdio"], "env": {"KEY": "${LOCAL_KEY}"}},
        },
        channels={"slack:C1": {"mcp": ["tracker", "local"]}},
    )
    assert parsed.policy_for("slack:C1").mcp == ("tracker", "local")
    assert parsed.policy_for("slack:C2").mcp == ()  # no grant, no servers
    assert parsed.mcp["local"].timeout_s == 60  # the default
    assert parsed.mcp["tracker"].tools == ("search",) and parsed.mcp["local"].tools is None
    tracker = parsed.mcp["tracker"]
    assert "tok-123456789" in tracker.secrets() and "Bearer tok-123456789" in tracker.secrets()
    assert "tok-123456789" not in repr(parsed)  # secrets are SecretStr: never printed


def test_the_credentials_leave_the_bots_environment() -> None:
    parsed = settings(
        mcp={
            "tracker": {"url": "https://t.example/mcp", "headers": {"Authorization": "Bearer ${TRACKER_TOKEN}"}},
            "local": {"command": "x", "env": {"KEY": "${LOCAL_KEY}"}},
        }
    )
    assert {"Bearer tok-123456789", "key-abcdef"} <= secret_values(parsed)
    environ = {"TRACKER_TOKEN": "tok-123456789", "LOCAL_KEY": "key-abcdef", "OTHER": "kept", "PATH": "/bin"}
    dropped = drop_secrets(parsed, {"TRACKER_TOKEN", "LOCAL_KEY"}, environ)
    assert dropped == ["LOCAL_KEY", "TRACKER_TOKEN"] and environ == {"OTHER": "kept", "PATH": "/bin"}


def test_the_example_in_config_yaml_is_valid() -> None:
    lines = (Path(__file__).resolve().parents[2] / "config.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mcp:"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith("#"))
    example = "mcp:\n" + "\n".join(line[1:] for line in lines[start + 1 : end] if line.startswith("#"))
    raw = yaml.safe_load(example)
    parsed = parse_settings(
        {
            "llm": {"base_url": "http://127.0.0.1:9/v1"},
            **raw,
            "channels": {"slack:C0123": {"mcp": ["tracker", "metrics"]}},
        },
        env={"TRACKER_MCP_TOKEN": "t" * 10, "METRICS_API_KEY": "k" * 10},
    )
    assert set(parsed.mcp) == {"tracker", "metrics"} and parsed.mcp["tracker"].timeout_s == 30
