"""What the model is told of a tool's result, and what lands in the thread's workspace."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import mcp_types as types
import pytest

from bot.mcp.hiding import Hider
from bot.mcp.result import HEAD_CHARS, MAX_TEXT_CHARS, present
from kernels.host.workspace import Workspace
from tests.mcp.servers import tiny_png

MiB = 2**20
SECRET = "sk-secret-abcdef123456"


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    folder = tmp_path / "ws"
    folder.mkdir()
    return Workspace(folder, max_file_bytes=8 * MiB, quota_bytes=16 * MiB)


def result(
    *parts: types.ContentBlock, error: bool = False, structured: dict[str, object] | None = None
) -> types.CallToolResult:
    return types.CallToolResult(content=list(parts), is_error=error, structured_content=structured)


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


async def show(workspace: Workspace, call: types.CallToolResult) -> tuple[str, list[str]]:
    presented = await present(call, function="tracker__big", workspace=workspace, hider=Hider([SECRET]))
    return presented.text, presented.files


async def test_a_short_text_goes_to_the_model_whole(workspace: Workspace) -> None:
    told, files = await show(workspace, result(text("3 open issues"), text("2 closed")))
    assert told == "3 open issues\n2 closed" and files == []
    assert os.listdir(workspace.path) == []


async def test_a_3_mb_text_is_saved_and_only_its_head_is_told(workspace: Workspace) -> None:
    body = "".join(f"row {i:011d}\n" for i in range(3 * MiB // 16))
    told, files = await show(workspace, result(text(body)))
    assert files == ["tracker__big.txt"]
    assert (workspace.path / "tracker__big.txt").read_text() == body
    assert len(told) < HEAD_CHARS + 400
    assert f"The result is {len(body):,} characters" in told and "`tracker__big.txt`" in told
    assert told.endswith(body[:HEAD_CHARS])
    again, files = await show(workspace, result(text(body)))
    assert files == ["tracker__big-2.txt"]  # never over an earlier one


async def test_a_text_just_over_the_limit_is_saved_as_json_when_it_looks_like_json(workspace: Workspace) -> None:
    body = json.dumps([{"n": i} for i in range(MAX_TEXT_CHARS)])
    told, files = await show(workspace, result(text(body)))
    assert files == ["tracker__big.json"] and "`tracker__big.json`" in told


async def test_secrets_are_hidden_in_what_is_told_and_what_is_saved(workspace: Workspace) -> None:
    told, _ = await show(workspace, result(text(f"key={SECRET}")))
    assert told == "key=[hidden]"
    big = f"{SECRET}\n" + "x" * (MAX_TEXT_CHARS * 2)
    told, files = await show(workspace, result(text(big)))
    assert SECRET not in told and SECRET.encode() not in (workspace.path / files[0]).read_bytes()
    blob = base64.b64encode(b"\x00binary " + SECRET.encode()).decode()
    resource = types.BlobResourceContents(uri="test://x.bin", mime_type="application/octet-stream", blob=blob)
    _, files = await show(workspace, result(types.EmbeddedResource(type="resource", resource=resource)))
    assert SECRET.encode() not in (workspace.path / files[0]).read_bytes()


async def test_an_error_result_is_one_sentence(workspace: Workspace) -> None:
    told, files = await show(workspace, result(text(f"closed for\nmaintenance {SECRET}"), error=True))
    assert told == "The tool reported an error: closed for maintenance [hidden]" and files == []


async def test_an_error_cut_across_a_secret_shows_no_part_of_it(workspace: Workspace) -> None:
    # The sentence is cut to 300 characters: cut first, the secret's beginning would survive it.
    told, _ = await show(workspace, result(text("x" * 290 + f" {SECRET}"), error=True))
    assert SECRET[:8] not in told and told.endswith("[hidden]")


async def test_images_and_resources_are_saved_for_the_kernel(workspace: Workspace) -> None:
    png = tiny_png()
    image = types.ImageContent(type="image", data=base64.b64encode(png).decode(), mime_type="image/png")
    csv = types.TextResourceContents(uri="test://exports/sales.csv", mime_type="text/csv", text="a,b\n1,2\n")
    link = types.ResourceLink(type="resource_link", name="report", uri="https://example.org/report")
    told, files = await show(
        workspace, result(text("Sales"), image, types.EmbeddedResource(type="resource", resource=csv), link)
    )
    assert files == ["tracker__big.png", "tracker__big-sales.csv"]
    assert (workspace.path / "tracker__big.png").read_bytes() == png
    assert (workspace.path / "tracker__big-sales.csv").read_text() == "a,b\n1,2\n"
    assert told.startswith("Sales\n\n")
    assert f"An image (image/png, {len(png):,} bytes) is saved as `tracker__big.png`." in told
    assert "A resource (text/csv, 8 characters) is saved as `tracker__big-sales.csv`." in told
    assert "A link to a resource (not fetched): report: https://example.org/report" in told


async def test_structured_content_alone_is_told_as_json(workspace: Workspace) -> None:
    told, _ = await show(workspace, result(structured={"open": 3}))
    assert told == '{"open": 3}'


async def test_a_result_over_the_quota_is_not_saved_and_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "small"
    folder.mkdir()
    small = Workspace(folder, max_file_bytes=MiB, quota_bytes=MiB)
    told, files = await show(small, result(text("y" * (2 * MiB))))
    assert files == [] and os.listdir(folder) == []  # the partial file is gone
    assert "could not be saved (the workspace's quota or the per-file limit would be passed)" in told
    assert told.endswith("y" * HEAD_CHARS)


async def test_an_empty_result_says_so(workspace: Workspace) -> None:
    told, _ = await show(workspace, result())
    assert told == "The tool returned nothing."
