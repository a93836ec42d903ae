"""Discord's outbound link step: a masked link opens only what it shows (pure functions)."""

from __future__ import annotations

import pytest

from adapters.discord.render import answer, text
from adapters.discord.replies import send_text, text_chunks
from adapters.links import allowed_target, disguised, looks_like_address, same_address


@pytest.mark.parametrize(
    ("markdown", "shown"),
    [
        ("[paypal.com](https://evil.example/login)", "paypal.com <https://evil.example/login>"),
        ("[https://bank.example](https://evil.example)", "https://bank.example <https://evil.example>"),
        ("[**paypal**.com](<https://evil.example>)", "**paypal**.com <https://evil.example>"),
        ("[pay\u200bpal\u3002com](https://evil.example)", "pay\u200bpal\u3002com <https://evil.example>"),
        ("[`paypal.com`](https://evil.example)", "`paypal.com` <https://evil.example>"),
        ("![a.org](https://b.org/i.png)", "a.org <https://b.org/i.png>"),
        ("[boss@example.com](mailto:thief@evil.net)", "boss@example.com <mailto:thief@evil.net>"),
        ("[click](javascript:alert(1)) [home](/etc/passwd) [f](file:///etc/x)", "click) home f"),
        (
            "[the docs](https://x.org/a) and [mail me](mailto:a@b.org)",
            "[the docs](https://x.org/a) and [mail me](mailto:a@b.org)",
        ),
        ("[example.com](https://www.example.com/)", "[example.com](https://www.example.com/)"),
        ("[see [1]](https://x.org)", "[see [1]](https://x.org)"),
        ("`[paypal.com](https://evil.example)` stays", "`[paypal.com](https://evil.example)` stays"),
        (
            "```md\n[paypal.com](https://evil.example)\n```\n[paypal.com](https://evil.example)",
            "```md\n[paypal.com](https://evil.example)\n```\npaypal.com <https://evil.example>",
        ),
    ],
)
def test_a_masked_link_opens_only_what_it_shows(markdown: str, shown: str) -> None:
    assert text(markdown) == shown


def test_every_chunk_the_bot_sends_goes_through_the_link_step() -> None:
    answer = "Totals:\n| a | b |\n|---|---|\n| 1 | 2 |\n\n" + "[paypal.com](https://evil.example) " * 200
    chunks = text_chunks(answer)
    assert len(chunks) > 1
    assert all("](https://evil" not in chunk for chunk in chunks)
    assert "paypal.com <https://evil.example>" in chunks[-1]


async def test_send_text_sends_rendered_text() -> None:
    sent: list[str | None] = []

    async def send(content: str | None, files: object, view: object) -> None:
        sent.append(content)

    await send_text(send, "see [intranet.example.com](https://evil.example.net/)")
    assert sent == ["see intranet.example.com <https://evil.example.net/>"]


def test_the_link_rules_are_shared_by_the_platforms() -> None:
    assert allowed_target("https://x.org") and not allowed_target("javascript:x")
    assert looks_like_address("_paypal.com_") and same_address("www.Example.com/", "https://example.com")
    assert disguised("paypal.com", "https://evil.example") and not disguised("the docs", "https://evil.example")


@pytest.mark.parametrize(
    "markdown",
    [
        "```\nx = 1\n```python\n[paypal.com](https://evil.example)\n```",  # a tagged fence ends Discord's block
        "~~~\n[paypal.com](https://evil.example)\n~~~",  # ~~~ opens no block on Discord
        "```\ncode never closed\n[paypal.com](https://evil.example)",  # an unclosed block is none
    ],
)
def test_a_disguised_link_in_what_only_commonmark_calls_code_is_made_honest(markdown: str) -> None:
    """Discord reads fences its own way: a line CommonMark keeps inside a block may be prose to
    Discord's client, so it gets the link rules."""
    for rendered in (text(markdown), answer(markdown)):
        assert "[paypal.com](https://evil.example)" not in rendered
        assert "paypal.com <https://evil.example>" in rendered
