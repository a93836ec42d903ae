"""The bot token goes only to Slack's hosts (issue 31): a file whose link names another host is
refused without a request and the thread is told why; Slack's own files still download."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from tests.fakes.local_http import serve_locally
from tests.fakes.openai_server import answer
from tests.slack.conftest import running_bot


async def test_a_file_link_to_another_host_gets_no_request_and_no_token(tmp_path: Path) -> None:
    seen: list[tuple[str, str | None]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Authorization")))
        return web.Response(body=b"a,b\n1,2\n", content_type="text/csv")

    app = web.Application()
    app.router.add_get("/{name:.*}", record)
    runner, port = await serve_locally(app)
    try:
        async with running_bot(tmp_path, socket_mode=False) as bot:
            slack = bot.slack
            foreign = slack.add_file("q3.csv", b"a,b\n1,2\n", "text/csv")
            foreign["url_private"] = f"http://127.0.0.1:{port}/steal/q3.csv"
            foreign["url_private_download"] = f"http://127.0.0.1:{port}/steal/q3.csv?download=1"
            # Slack's port under another name is another origin, too.
            renamed = slack.add_file("q4.csv", b"a,b\n3,4\n", "text/csv")
            renamed["url_private_download"] = renamed["url_private_download"].replace("127.0.0.1", "localhost")
            genuine = slack.add_file("q5.csv", b"a,b\n5,6\n", "text/csv")
            bot.llm.script(answer("Looked."))
            event = slack.mention("C_TOKEN", "look at these", files=[foreign, renamed, genuine])
            await slack.post_event(bot.events_url, event)
            assert await bot.finished(event) == {"white_check_mark"}
            texts = bot.answers(event)
            for name in ("q3.csv", "q4.csv"):
                assert any(f"`{name}` was not added: its download link points outside Slack" in t for t in texts), texts
            assert not any("q5.csv" in t and "not added" in t for t in texts)
            assert slack.downloads == [(genuine["id"], True)]  # only Slack's own file was fetched
            prompt = next(m for m in bot.llm.requests[0]["messages"] if m["role"] == "user")["content"]
            assert "q5.csv" in prompt
        assert seen == []  # no request at all, so no Authorization header either
    finally:
        await runner.cleanup()
