"""Markdown → mrkdwn conversion and fence-safe splitting (pure functions)."""

from __future__ import annotations

import re

import pytest

from adapters.slack.format import MESSAGE_LIMIT, to_chunks, to_mrkdwn
from adapters.slack.render import Mention, markdown_text, mrkdwn, plain
from adapters.textsplit import split_markdown
from bot.safetext import inline_code as code_span


def test_inline_markdown_becomes_mrkdwn() -> None:
    text = "The **mean** is *4.2*, ~~old~~ gone; see [the docs](https://x.org/a?b=1&c=2) or <https://y.org>."
    assert to_mrkdwn(text) == (
        "The *mean* is _4.2_, ~old~ gone; see <https://x.org/a?b=1&amp;c=2|the docs> or <https://y.org>."
    )


def test_headings_bullets_quotes_and_escaping() -> None:
    text = "## Summary **now**\n- first\n* second\n> quoted **bit**\nx < y & z > w, 2*3*4 and snake_case_name"
    assert to_mrkdwn(text).split("\n") == [
        "*Summary now*",
        "• first",
        "• second",
        "> quoted *bit*",
        "x &lt; y &amp; z &gt; w, 2*3*4 and snake_case_name",
    ]


def test_code_is_left_alone_except_escaping_and_language_tag() -> None:
    text = "Run `a<b and **c**`:\n\n```python\nif a < b:\n    print('**not bold**')\n```\nafter"
    assert to_mrkdwn(text) == ("Run `a&lt;b and **c**`:\n\n```\nif a &lt; b:\n    print('**not bold**')\n```\nafter")


def test_tables_become_aligned_code_blocks() -> None:
    text = "Totals:\n| month | amount |\n|---|---:|\n| Jan | 100 |\n| A&B | 7 |\n\nDone."
    assert to_mrkdwn(text) == (
        "Totals:\n```\nmonth | amount\n------+-------\nJan   |    100\nA&amp;B   |      7\n```\n\nDone."
    )


def _fences_balanced(chunk: str) -> bool:
    return len(re.findall(r"^```", chunk, flags=re.M)) % 2 == 0


def test_split_keeps_short_text_whole_and_drops_empty() -> None:
    assert split_markdown("hello", 100) == ["hello"]
    assert split_markdown("\n \n", 100) == []


def test_split_prefers_paragraph_breaks() -> None:
    paragraphs = [f"Paragraph {i}: " + "words " * 12 for i in range(10)]
    chunks = split_markdown("\n\n".join(paragraphs), 250)
    assert all(len(c) <= 250 for c in chunks)
    assert all(c.startswith("Paragraph") for c in chunks)  # no chunk starts mid-paragraph
    assert "".join(chunks).replace("\n", "") == "".join(paragraphs)


@pytest.mark.parametrize("limit", [120, 300, 2000])
def test_split_closes_and_reopens_code_fences(limit: int) -> None:
    code = "\n".join(f"value_{i} = {i} * 2  # a comment" for i in range(200))
    text = f"Here is the code:\n\n```python\n{code}\n```\n\nThat is all."
    chunks = split_markdown(text, limit)
    assert len(chunks) > 1
    for chunk in chunks:
        assert len(chunk) <= limit
        assert _fences_balanced(chunk), chunk
    assert all(c.startswith("```python") for c in chunks[1:-1])
    # Nothing lost: strip the added fences and the code reads as before.
    body = "\n".join(chunks)
    assert all(f"value_{i} = {i} * 2" in body for i in range(200))
    assert chunks[-1].endswith("That is all.")


def test_split_cuts_overlong_lines() -> None:
    line = "x" * 1000
    chunks = split_markdown(line, 100)
    assert all(len(c) <= 100 for c in chunks)
    assert "".join(chunks) == line


def test_long_answer_chunks_fit_slack() -> None:
    table = "\n".join(f"| {i} | {i * i} |" for i in range(400))
    text = "# Squares\n\n| n | n² |\n|---|---|\n" + table + "\n\nDone **now**."
    chunks = to_chunks(text)
    assert len(chunks) >= 2
    assert all(len(c) <= MESSAGE_LIMIT and _fences_balanced(c) for c in chunks)
    assert chunks[0].startswith("*Squares*") and chunks[-1].endswith("Done *now*.")


def test_only_the_bots_own_mentions_are_tokens() -> None:
    assert mrkdwn("asked by ", Mention("user", "U0ASKER"), " in ", Mention("channel", "C0ROOM")).text == (
        "asked by <@U0ASKER> in <#C0ROOM>"
    )
    assert (
        mrkdwn("<@U0ASKER> <!channel> <!subteam^S1>").text
        == "&lt;@\u2060U0ASKER&gt; &lt;!channel&gt; &lt;!subteam^S1&gt;"
    )
    with pytest.raises(ValueError):
        Mention("user", "!channel").token()
    with pytest.raises(ValueError):
        Mention("channel", "C1|x> <!here").token()
    assert "<!" not in markdown_text("<!here> `<!here>`\n```\n<!channel>\n```").text
    assert plain("<!here> `x` @channel") == "‹!here› x @\u2060channel"


@pytest.mark.parametrize(
    ("markdown", "shown"),
    [
        ("[see the chart](!channel)", "see the chart"),
        ("[team](!subteam^S1|analysts) [you](@U1) [room](#C1)", "team you room"),
        ("[x](javascript:alert(1)) [y](ftp://h.org/f) [z](/etc/passwd)", "x) y z"),
        ("[https://intranet.example.com/q3](https://evil.example.net/login)", "<https://evil.example.net/login>"),
        ("[intranet.example.com](https://evil.example.net/)", "<https://evil.example.net/>"),
        ("[boss@example.com](mailto:thief@evil.net)", "<mailto:thief@evil.net>"),
        ("[example.com](https://www.example.com/)", "<https://www.example.com/|example.com>"),
        (
            "[the docs](https://x.org/a) [mail me](mailto:a@b.org)",
            "<https://x.org/a|the docs> <mailto:a@b.org|mail me>",
        ),
        ("<https://evil.example.net|intranet.example.com>", "&lt;https://evil.example.net|intranet.example.com&gt;"),
        ("@here @channel, mail a@b.org", "@\u2060here @\u2060channel, mail a@b.org"),
    ],
)
def test_links_open_only_what_they_show(markdown: str, shown: str) -> None:
    assert to_mrkdwn(markdown) == shown


def test_a_stream_split_anywhere_never_forms_a_token_or_a_disguised_link() -> None:
    """What Slack joins from a stream's pieces, cut after every character of a hostile answer."""
    from adapters.slack.stream import _settled

    text = (
        "Hi <!channel> and <@U0BOSS>, [see](!here) [ok](https://a.example.org/x) "
        "<https://evil.example.net|intranet.example.com> [intranet.example.com](https://evil.example.net/)\n"
        "`<!here>` and @everyone\n```\n<!subteam^S1>\n```\n[ref]: !channel\n"
    )
    sent, appended = "", 0
    for end in range(1, len(text) + 1):
        rendered = markdown_text(_settled(text[:end])).text
        if rendered.startswith(sent) and rendered != sent:
            sent, appended = rendered, appended + 1
        assert not re.search(r"<[!@#]|<[^<>\s]*\|", sent), sent
        assert not re.search(r"(?<![\w@])@(here|channel|everyone)\b", sent), sent
        assert "](https://evil" not in sent and "intranet.example.com](" not in sent
    assert appended > 20  # it did stream piece by piece


@pytest.mark.parametrize(
    ("markdown", "mrkdwn_shown", "markdown_shown"),
    [
        (
            "see [`pd.merge()`](https://pandas.pydata.org/x)",
            "see <https://pandas.pydata.org/x|`pd.merge()`>",
            "see [`pd.merge()`](https://pandas.pydata.org/x)",
        ),
        (
            "[the `merge` docs](https://pandas.pydata.org/x) and `a<b`",
            "<https://pandas.pydata.org/x|the `merge` docs> and `a&lt;b`",
            "[the `merge` docs](https://pandas.pydata.org/x) and `a<\u2060b`",
        ),
        # Code that reads as a host name is an address to the reader: never a disguise.
        ("[`paypal.com`](https://evil.example)", "<https://evil.example>", "https://evil.example"),
        (
            "[`DataFrame.merge`](https://pandas.pydata.org/x)",
            "<https://pandas.pydata.org/x>",
            "https://pandas.pydata.org/x",
        ),
        (
            "[`paypal.com`](https://www.paypal.com/)",
            "<https://www.paypal.com/|`paypal.com`>",
            "[`paypal.com`](https://www.paypal.com/)",
        ),
        ("[`@here`](!channel) a\x00b", "`@here` ab", "`@here` ab"),
    ],
)
def test_a_link_whose_label_is_code_shows_the_code(markdown: str, mrkdwn_shown: str, markdown_shown: str) -> None:
    assert to_mrkdwn(markdown) == mrkdwn_shown
    assert markdown_text(markdown).text == markdown_shown


@pytest.mark.parametrize(
    "label",
    [
        "**paypal**.com",
        "_paypal.com_",
        "paypal\\.com",
        "pay\u200bpal.com",
        "paypal\u3002com",
        "paypal\uff0ecom",
        "\uff50aypal.com",
        "[paypal.com]",
        "~~paypal~~.com",
        "http://[paypal.com]",
    ],
)
def test_markup_in_a_label_does_not_hide_an_address(label: str) -> None:
    markdown = f"[{label}](https://evil.example/login)"
    assert to_mrkdwn(markdown) == "<https://evil.example/login>"
    assert markdown_text(markdown).text == "https://evil.example/login"


def test_a_marked_up_label_naming_its_own_target_stays_a_link() -> None:
    assert to_mrkdwn("[**paypal**.com](https://paypal.com)") == "<https://paypal.com|**paypal**.com>"
    assert markdown_text("[a_b@x.org](mailto:a_b@x.org)").text == "[a_b@x.org](mailto:a_b@x.org)"
    assert to_mrkdwn("[see [1]](https://x.org)") == "<https://x.org|see [1]>"


def test_a_name_shown_as_code_keeps_its_backticks_from_ending_the_span() -> None:
    # A file a kernel wrote can be named so (no slash needed for a mailto link).
    name = "a`` [click](mailto:x@evil.example) ``b.csv"
    shown = mrkdwn(f":warning: I could not read {code_span(name)} to send it.").text
    assert "<mailto:" not in shown and shown.count("`") == 2
