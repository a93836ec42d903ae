"""Real MCP servers for the tests and the bench, built with the official SDK (``mcp``).

``python -m tests.mcp.servers http --port N --token-file F`` serves streamable HTTP on 127.0.0.1
and answers only requests that carry ``Authorization: Bearer <the token in F>`` (401 otherwise;
the token is read from a file so that it is on no command line a kernel could read);
``python -m tests.mcp.servers stdio --token-sha256 H`` speaks over stdin/stdout and checks that
its ``STDIO_TOKEN`` environment variable hashes to ``H`` (so the token is not on its command line);
it says on stderr that it starts, with its token (which the bot must hide in its log).

Both offer the same tools: ``echo``, ``add``, ``big`` (a text of any size; the SDK sends it twice,
as content and as structured content), ``big_text`` (the same, sent once), ``sleep``, ``chart``
(a PNG image), ``table`` (an embedded CSV resource), ``fail`` (an error result), ``leak`` (a
result that holds the server's own token: the bot must hide it), ``env_names`` (the names in
the server's environment), ``token_ok`` and ``drop_table`` (annotated destructive).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import struct
import sys
import zlib
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import EmbeddedResource, ImageContent, TextContent, TextResourceContents, ToolAnnotations

READ_ONLY = ToolAnnotations(read_only_hint=True)


def tiny_png() -> bytes:
    """A valid 2×2 red PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * 2 for _ in range(2))
    header = struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def build(secret: str) -> MCPServer:
    """The server with its tools; ``secret`` is what ``leak`` gives away."""
    server: MCPServer = MCPServer("threadbook-test", instructions="A test server.", log_level="WARNING")

    @server.tool(description="Echo the text back.", annotations=READ_ONLY)
    def echo(text: str) -> str:
        return text

    @server.tool(description="Add two numbers.", annotations=READ_ONLY)
    def add(a: float, b: float) -> float:
        return a + b

    @server.tool(description="A text of `size` characters: lines of 'row N'.", annotations=READ_ONLY)
    def big(size: int) -> str:
        line_count = size // 16 + 1
        text = "".join(f"row {i:011d}\n" for i in range(line_count))
        return text[:size]

    @server.tool(
        description="Like `big`, sent once (as content, not also as structured content).",
        annotations=READ_ONLY,
        structured_output=False,
    )
    def big_text(size: int) -> str:
        return big(size)

    @server.tool(description="Sleep for `seconds`, then say so.", annotations=READ_ONLY)
    async def sleep(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool(description="A chart of the sales, as a PNG image.", annotations=READ_ONLY)
    def chart() -> list[Any]:
        data = base64.b64encode(tiny_png()).decode()
        return [
            TextContent(type="text", text="Sales chart"),
            ImageContent(type="image", data=data, mime_type="image/png"),
        ]

    @server.tool(description="The sales table, as a CSV resource.", annotations=READ_ONLY)
    def table() -> list[Any]:
        csv = "region,amount\nnorth,10\nsouth,32\n"
        resource = TextResourceContents(uri="test://sales.csv", mime_type="text/csv", text=csv)
        return [EmbeddedResource(type="resource", resource=resource)]

    @server.tool(description="Always fails.", annotations=READ_ONLY)
    def fail() -> str:
        raise ToolError(f"the warehouse is closed for maintenance (token {secret})")

    @server.tool(description="Tells its secret.", annotations=READ_ONLY)
    def leak() -> str:
        return f"my token is {secret}, keep it safe"

    @server.tool(description="The names in this server's environment, sorted.", annotations=READ_ONLY)
    def env_names() -> str:
        return ",".join(sorted(os.environ))

    @server.tool(description="Whether STDIO_TOKEN is the expected one.", annotations=READ_ONLY)
    def token_ok() -> str:
        value = os.environ.get("STDIO_TOKEN", "")
        return "token ok" if hashlib.sha256(value.encode()).hexdigest() == EXPECTED_SHA[0] else "token wrong"

    @server.tool(description="Drop a table.", annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    def drop_table(name: str) -> str:
        return f"dropped {name}"

    return server


EXPECTED_SHA = [""]


class BearerOnly:
    """ASGI middleware: 401 unless ``Authorization: Bearer <token>``."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != self.expected:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await self.app(scope, receive, send)


def serve_http(port: int, token: str, json_response: bool) -> None:
    """Streamable HTTP on 127.0.0.1:``port`` behind the bearer check (blocks)."""
    import uvicorn

    app = build(token).streamable_http_app(json_response=json_response)
    config = uvicorn.Config(BearerOnly(app, token), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    uvicorn.Server(config).run()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["http", "stdio"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-file", default="")
    parser.add_argument("--json", action="store_true", help="answer requests with JSON instead of SSE")
    parser.add_argument("--token-sha256", default="")
    args = parser.parse_args(argv)
    if args.transport == "http":
        with open(args.token_file, encoding="utf-8") as file:
            token = file.read().strip()
        serve_http(args.port, token, args.json)
        return
    EXPECTED_SHA[0] = args.token_sha256
    token = os.environ.get("STDIO_TOKEN", "")
    print(f"stdio test server starting with token {token}", file=sys.stderr, flush=True)
    build(token).run("stdio")


if __name__ == "__main__":
    main()
