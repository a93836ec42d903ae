"""Slack's agent messaging, end to end (real bolt + slack_sdk, Core, kernels; fake Slack and
model): the manifest declares ``agent_view``; the Messages tab offers prompts and greets each
person once, across restarts; a DM question is answered; the channel a person views lends
its policy to their DM thread only when they are a member of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.slack import agent_view
from bot.config import ChannelPolicy
from tests.fakes.openai_server import answer, tool_call
from tests.slack.conftest import running_bot

REPO = Path(__file__).resolve().parents[2]
DM = "D_ALICE"
SALES_PROMPTS = [{"title": "Revenue by region", "message": "Chart revenue by region."}]


def channels(data_dir: Path) -> dict[str, Any]:
    """#sales lends its members' DM threads its prompt, data folder and prompts."""
    return {
        "slack:C_SALES": {
            "system_prompt": "SALES-CHANNEL-PROMPT: amounts are in euros.",
            "data_dir": str(data_dir),
            "suggested_prompts": SALES_PROMPTS,
        }
    }


def sales_data(tmp_path: Path) -> Path:
    folder = tmp_path / "sales-data"
    folder.mkdir(exist_ok=True)
    (folder / "q3.csv").write_text("region,amount\nnorth,10\n")
    return folder


def system_prompt(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"])


def test_the_manifest_declares_the_agent_experience() -> None:
    manifest = yaml.safe_load((REPO / "docs" / "slack-manifest.yaml").read_text())
    features = manifest["features"]
    assert "assistant_view" not in features  # the surface Slack is retiring
    assert features["agent_view"]["agent_description"]
    assert features["app_home"]["messages_tab_enabled"] is True
    events = set(manifest["settings"]["event_subscriptions"]["bot_events"])
    assert {"app_home_opened", "app_context_changed", "message.im", "agent_session_stopped"} <= events
    assert "assistant:write" in manifest["oauth_config"]["scopes"]["bot"]


async def test_the_messages_tab_offers_prompts_and_greets_once_also_after_a_restart(tmp_path: Path) -> None:
    for _start in range(2):
        async with running_bot(tmp_path, socket_mode=False) as bot:
            slack = bot.slack
            for _ in range(3):
                await slack.post_event(bot.events_url, slack.app_home_opened("U_ALICE", DM))
            await slack.post_event(bot.events_url, slack.app_home_opened("U_ALICE", DM, tab="home"))
            await slack.wait_for(lambda s=slack: len(s.calls_to("assistant.threads.setSuggestedPrompts")) >= 3)
            await bot.adapter.wait_idle()
            greetings = [m for m in slack.messages if m.channel == DM]
            if _start == 0:
                assert len(greetings) == 1 and "Attach a file" in greetings[0].text  # once for three opens
            else:
                assert greetings == []  # remembered in the store: no second greeting after a restart
            calls = slack.calls_to("assistant.threads.setSuggestedPrompts")
            assert len(calls) == 3 and all("thread_ts" not in c.args for c in calls)  # an agent app's DM prompts
            assert [p["title"] for p in slack.suggested_prompts[(DM, "")]] == [
                "Summarise a CSV",
                "Chart a trend",
                "What can you do?",
            ]


async def test_a_dm_question_is_answered_in_its_thread(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False) as bot:
        slack = bot.slack
        bot.llm.script(tool_call("print(6 * 7)"), answer("It is 42."))
        question = slack.message_event(DM, "what is 6*7?", user="U_ALICE", channel_type="im")
        await slack.post_event(bot.events_url, question)
        assert await bot.finished(question) == {"white_check_mark"}
        assert bot.answers(question)[-1] == "It is 42."
        assert all(m.thread_ts == question["ts"] for m in slack.bot_messages(DM, question["ts"]))


async def test_the_channel_in_view_lends_a_member_its_policy_once(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False, channels=channels(sales_data(tmp_path))) as bot:
        slack = bot.slack
        slack.channel_members["C_SALES"] = {f"U{n}" for n in range(2500)} | {"U_ALICE"}  # several pages
        slack.channel_names["C_SALES"] = "sales"
        await slack.post_event(bot.events_url, slack.app_context_changed("U_ALICE", DM, "C_SALES"))
        await slack.wait_for(lambda: slack.suggested_prompts.get((DM, "")) == SALES_PROMPTS, 3)

        bot.llm.script(
            tool_call("import os\nprint(sorted(os.listdir(os.environ['THREADBOOK_DATA_DIR'])))"),
            lambda request: answer("Files: " + request["messages"][-1]["content"]),
        )
        question = slack.message_event(DM, "which files are there?", user="U_ALICE", channel_type="im")
        await slack.post_event(bot.events_url, question)
        assert await bot.finished(question) == {"white_check_mark"}
        assert "SALES-CHANNEL-PROMPT" in system_prompt(bot.llm.requests[0])
        assert "q3.csv" in bot.answers(question)[-1]  # the channel's data folder, in the DM thread's kernel
        said = [t for t in bot.answers(question) if "#sales" in t]
        assert said == ["Using #sales's sources and files in this thread."]

        # The next message of the thread keeps the policy and is not told again.
        bot.llm.script(answer("Still euros."))
        again = slack.message_event(
            DM, "and the currency?", user="U_ALICE", channel_type="im", thread_ts=question["ts"]
        )
        await slack.post_event(bot.events_url, again)
        assert await bot.finished(again) == {"white_check_mark"}
        assert "SALES-CHANNEL-PROMPT" in system_prompt(bot.llm.requests[-1])
        assert len([t for t in bot.answers(question) if "#sales" in t]) == 1


async def test_the_channel_in_view_is_refused_to_a_non_member(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False, channels=channels(sales_data(tmp_path))) as bot:
        slack = bot.slack
        slack.channel_members["C_SALES"] = {"U_SOMEONE_ELSE"}
        slack.channel_names["C_SALES"] = "sales"
        bot.llm.script(
            tool_call("import os\nprint(os.environ.get('THREADBOOK_DATA_DIR'))"),
            lambda request: answer("Data dir: " + request["messages"][-1]["content"]),
        )
        # The context rides on the message itself (Slack adds app_context to message.im).
        question = slack.message_event(
            DM,
            "which files are there?",
            user="U_BOB",
            channel_type="im",
            app_context={"entities": [{"type": "slack#/types/channel_id", "value": "C_SALES"}]},
        )
        await slack.post_event(bot.events_url, question)
        assert await bot.finished(question) == {"white_check_mark"}
        assert "SALES-CHANNEL-PROMPT" not in system_prompt(bot.llm.requests[0])
        answers = bot.answers(question)
        assert any("not a member of #sales" in t for t in answers)
        assert answers[-1].endswith("None")  # no data folder of #sales reached this kernel
        assert not any("Using #sales" in t for t in answers)


async def test_opening_the_tab_while_viewing_a_channel_offers_its_prompts(tmp_path: Path) -> None:
    async with running_bot(tmp_path, socket_mode=False, channels=channels(sales_data(tmp_path))) as bot:
        slack = bot.slack
        await slack.post_event(bot.events_url, slack.app_home_opened("U_ALICE", DM, viewing="C_SALES"))
        assert await slack.wait_for(lambda: slack.suggested_prompts.get((DM, ""))) == SALES_PROMPTS


def test_a_viewed_channel_lends_its_sources_and_mcp_servers_not_its_model_or_limits() -> None:
    dm = ChannelPolicy(model="dm-model", sources=(), mcp=())
    sales = ChannelPolicy(system_prompt="S", model="sales-model", sources=("warehouse",), mcp=("tracker",))
    lent = dm.in_view_of(sales)
    assert (lent.system_prompt, lent.sources, lent.mcp) == ("S", ("warehouse",), ("tracker",))
    assert lent.model == "dm-model"


async def test_a_person_who_leaves_the_channel_loses_its_policy_in_their_dm_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Membership is asked again on every turn of a DM thread that took a channel's policy (Slack
    caches it a minute): once the person left, the thread keeps its variables but neither the
    channel's prompt nor its data folder, whose kernel is stopped."""
    monkeypatch.setattr(agent_view, "MEMBERSHIP_TTL_S", 0.0)  # no minute of Slack's cache to wait out
    async with running_bot(tmp_path, socket_mode=False, channels=channels(sales_data(tmp_path))) as bot:
        slack = bot.slack
        slack.channel_members["C_SALES"] = {"U_ALICE"}
        slack.channel_names["C_SALES"] = "sales"
        bot.llm.script(tool_call("kept = 41\nprint('ok')"), answer("Noted."))
        question = slack.message_event(
            DM,
            "remember 41",
            user="U_ALICE",
            channel_type="im",
            app_context={"entities": [{"type": "slack#/types/channel_id", "value": "C_SALES"}]},
        )
        await slack.post_event(bot.events_url, question)
        assert await bot.finished(question) == {"white_check_mark"}
        assert "SALES-CHANNEL-PROMPT" in system_prompt(bot.llm.requests[0])

        slack.channel_members["C_SALES"] = set()  # alice left #sales
        bot.llm.script(
            tool_call("import os\nprint(kept + 1, os.environ.get('THREADBOOK_DATA_DIR'))"),
            lambda request: answer("Now: " + request["messages"][-1]["content"]),
        )
        again = slack.message_event(DM, "and now?", user="U_ALICE", channel_type="im", thread_ts=question["ts"])
        await slack.post_event(bot.events_url, again)
        assert await bot.finished(again) == {"white_check_mark"}
        assert "SALES-CHANNEL-PROMPT" not in system_prompt(bot.llm.requests[-1])
        answers = bot.answers(again)
        assert any("no longer a member" in t for t in answers)
        assert answers[-1].endswith("42 None")  # variables kept, the channel's data folder gone
