"""``python -m bench.quality``: how well a model answers data questions through the whole bot.

Each question (:mod:`bench.quality_questions`, over the seeded files of
:mod:`bench.quality_data`) is the first message of a new thread, sent through the real core —
dispatcher, upload ingest, turn runner, agent loop, kernels — by an in-memory chat platform.
The reply is graded exactly (:mod:`bench.quality_checks`); the run prints a table per
question (pass/fail, code runs, tokens, seconds), accuracy and totals, and writes JSON.

``--scripted`` runs against the project's scripted OpenAI server with an oracle model
(:mod:`bench.quality_oracle`) instead of a real endpoint: a self-test of the harness, used
in CI. There every question must pass except those named with ``--wrong``, which must fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.quality_checks import ReplyFiles, Verdict
from bench.quality_data import SEED, generate, write_files
from bench.quality_questions import Question, check_unique_ids, questions
from bot.app import Core
from bot.config import Settings, parse_settings
from bot.events import Attachment, InboundMessage, Reply, ThreadKey
from tests.fakes.memory import MemoryOutbox

RESULTS = Path(__file__).with_name("quality-results.json")
PLATFORM = "bench"
CHUNK = 64 * 1024
log = logging.getLogger("bench.quality")


@dataclass(frozen=True)
class Endpoint:
    """The model under test and how the bot talks to it."""

    base_url: str
    model: str
    api_key: str = "none"
    request_timeout_s: float = 300.0
    max_rounds: int = 8
    extra: dict[str, Any] = field(default_factory=dict)  # more `llm:` settings, e.g. temperature


@dataclass
class Outcome:
    """One question's result."""

    id: str
    passed: bool
    detail: str
    expected: str
    answer_line: bool | None = None
    rounds: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    reply_ok: bool = False
    reply: str = ""
    images: int = 0
    files: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    error: str | None = None


def settings_for(endpoint: Endpoint, root: Path, sandbox: str) -> Settings:
    """Bot settings for a bench run: data under ``root``, one warm kernel, ``sandbox``."""
    llm = {
        "base_url": endpoint.base_url,
        "api_key": endpoint.api_key,
        "model": endpoint.model,
        "request_timeout_s": endpoint.request_timeout_s,
        "max_rounds": endpoint.max_rounds,
        **endpoint.extra,
    }
    raw = {
        "llm": llm,
        "kernels": {
            "workspace_root": str(root / "workspaces"),
            "sandbox": sandbox,
            "warm_pool": 1,
            "fork_server": True,
            "preload": ["pandas", "numpy", "matplotlib"],
            "exec_timeout_s": 120,
            "max_kernels": 4,
            "packages": {"dir": str(root / "packages")},
        },
        "storage": {"path": str(root / "threadbook.db")},
    }
    return parse_settings(raw, env={})


def file_attachment(path: Path, size: int) -> Attachment:
    """An upload of ``size`` bytes streamed from ``path`` (opened and read in worker threads)."""

    async def fetch() -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(path.open, "rb")
        try:
            while chunk := await asyncio.to_thread(handle.read, CHUNK):
                yield chunk
        finally:
            handle.close()

    return Attachment(name=path.name, size=size, mime=None, fetch=fetch)


async def ask(core: Core, question: Question, uploads: dict[str, tuple[Path, int]]) -> Outcome:
    """Send ``question`` as a new thread's first message, grade the reply, measure the turn.

    ``uploads`` maps a file name to its path and size; the question's files are attached.
    """
    key = ThreadKey(PLATFORM, "quality", "bench", question.id)
    message = InboundMessage(
        key=key,
        message_id=f"{question.id}-{time.time_ns()}",
        user_id="U-bench",
        user_name="bench",
        text=question.message,
        attachments=tuple(file_attachment(*uploads[name]) for name in question.files),
    )
    outbox = MemoryOutbox()
    started = time.perf_counter()
    await core.dispatcher.handle(message, outbox)
    seconds = time.perf_counter() - started
    reply: Reply | None = outbox.replies[-1] if outbox.replies else None
    if reply is None:
        verdict = Verdict(False, f"no reply (notices: {outbox.notices})")
        graded = ReplyFiles(text="", images=(), files={})
    else:
        graded = await asyncio.to_thread(ReplyFiles.of, reply)
        verdict = question.check.grade(graded)
        if not reply.ok:  # still graded (a summary at the round limit may hold the answer), but said
            first = next((line for line in reply.text.splitlines() if line.strip()), "")[:120]
            verdict = Verdict(
                verdict.passed, f"turn did not finish normally ({first}); {verdict.detail}", verdict.answer_line
            )
    prompt_tokens, completion_tokens = await core.store.usage.thread_tokens(key)
    outcome = Outcome(
        id=question.id,
        passed=verdict.passed,
        detail=verdict.detail,
        expected=question.check.describe(),
        answer_line=verdict.answer_line,
        rounds=await core.store.transcripts.cell_count(key),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        seconds=seconds,
        reply_ok=reply.ok if reply is not None else False,
        reply=graded.text[-2000:],
        images=len(graded.images),
        files=sorted(graded.files),
        notices=list(outbox.notices),
    )
    await core.pool.shutdown(str(key))  # one kernel at a time: the next question gets a fresh thread
    return outcome


async def run(endpoint: Endpoint, selected: Sequence[Question], root: Path, *, sandbox: str = "auto") -> list[Outcome]:
    """Every question in ``selected``, one after the other, through one running core."""
    paths = await asyncio.to_thread(write_files, generate(), root / "files")
    uploads = {name: (path, (await asyncio.to_thread(path.stat)).st_size) for name, path in paths.items()}
    outcomes: list[Outcome] = []
    async with Core.open(settings_for(endpoint, root, sandbox)) as core:
        for index, question in enumerate(selected, start=1):
            try:
                outcome = await ask(core, question, uploads)
            except Exception as exc:  # recorded as a failure; the run goes on
                log.exception("question %s failed to run", question.id)
                outcome = Outcome(
                    question.id,
                    False,
                    f"error: {type(exc).__name__}: {exc}",
                    question.check.describe(),
                    error=f"{type(exc).__name__}: {exc}",
                )
            outcomes.append(outcome)
            mark = "pass" if outcome.passed else "FAIL"
            print(
                f"  [{index}/{len(selected)}] {question.id:<26} {mark}  {outcome.seconds:6.1f} s  {outcome.detail[:90]}",
                file=sys.stderr,
                flush=True,
            )
    return outcomes


def totals(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Accuracy and sums over ``outcomes``."""
    passed = sum(1 for o in outcomes if o.passed)
    return {
        "questions": len(outcomes),
        "passed": passed,
        "accuracy": passed / len(outcomes) if outcomes else 0.0,
        "rounds": sum(o.rounds for o in outcomes),
        "prompt_tokens": sum(o.prompt_tokens for o in outcomes),
        "completion_tokens": sum(o.completion_tokens for o in outcomes),
        "seconds": sum(o.seconds for o in outcomes),
        "answer_line_missing": sum(1 for o in outcomes if o.answer_line is False),
    }


def table(outcomes: Sequence[Outcome]) -> str:
    """The results as a Markdown table, then accuracy and totals."""
    lines = [
        "| question | result | rounds | prompt tok | completion tok | s | expected | detail |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        result = "pass" if o.passed else "**FAIL**"
        detail = o.detail.replace("|", "\\|").replace("\n", " ")[:100]
        lines.append(
            f"| {o.id} | {result} | {o.rounds} | {o.prompt_tokens} | {o.completion_tokens} | "
            f"{o.seconds:.1f} | {o.expected.replace('|', '/')} | {detail} |"
        )
    t = totals(outcomes)
    lines += [
        "",
        f"accuracy: {t['passed']}/{t['questions']} = {100 * t['accuracy']:.1f} %",
        (
            f"totals: {t['rounds']} code runs, {t['prompt_tokens']} prompt + {t['completion_tokens']} completion "
            f"tokens, {t['seconds']:.1f} s; {t['answer_line_missing']} replies without an ANSWER line"
        ),
    ]
    return "\n".join(lines)


def select(all_questions: Sequence[Question], only: Sequence[str] | None) -> list[Question]:
    """The questions named in ``only`` (in the bench's order), or all; an unknown id is an error."""
    if not only:
        return list(all_questions)
    known = {q.id for q in all_questions}
    if unknown := sorted(set(only) - known):
        raise SystemExit(f"unknown question id(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [q for q in all_questions if q.id in set(only)]


def _llm_option(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return name.strip(), json.loads(value)
    except json.JSONDecodeError:
        return name.strip(), value


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.splitlines()[0])
    p.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", help="model name sent to the endpoint")
    p.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY", "none"),
        help="API key (default: $OPENAI_API_KEY, else 'none' for local servers)",
    )
    p.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON results")
    p.add_argument("--only", nargs="+", action="extend", metavar="ID", help="run only these question ids")
    p.add_argument("--list", action="store_true", help="list the questions and their expected answers, then exit")
    p.add_argument("--sandbox", choices=("auto", "bwrap", "none"), default="auto", help="kernel sandbox")
    p.add_argument("--max-rounds", type=int, default=8, help="code runs allowed per question (llm.max_rounds)")
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds per model request")
    p.add_argument(
        "--llm",
        type=_llm_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another llm.* setting, e.g. --llm temperature=0 (value parsed as JSON when it can be)",
    )
    p.add_argument("--min-accuracy", type=float, default=0.0, help="exit 1 below this accuracy (0..1)")
    p.add_argument(
        "--scripted", action="store_true", help="self-test: the scripted oracle model instead of --base-url/--model"
    )
    p.add_argument(
        "--wrong",
        nargs="+",
        action="extend",
        default=[],
        metavar="ID",
        help="with --scripted: the oracle answers these wrong (they must be reported as failing)",
    )
    return p


async def _main(args: argparse.Namespace, selected: list[Question]) -> list[Outcome]:
    async with AsyncExitStack() as stack:
        if args.scripted:
            from bench.quality_oracle import oracle
            from tests.fakes.openai_server import ScriptedOpenAI

            server = await stack.enter_async_context(ScriptedOpenAI())
            step = oracle(selected, wrong=set(args.wrong))
            server.script(*[step] * (4 * len(selected) + 10))
            endpoint = Endpoint(
                base_url=server.base_url,
                model=server.model,
                api_key="k",
                request_timeout_s=60,
                max_rounds=args.max_rounds,
            )
        else:
            endpoint = Endpoint(
                base_url=args.base_url,
                model=args.model,
                api_key=args.api_key,
                request_timeout_s=args.request_timeout,
                max_rounds=args.max_rounds,
                extra=dict(args.llm),
            )
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-quality-")))
        results = await run(endpoint, selected, root, sandbox=args.sandbox)
    return results


def main(argv: list[str] | None = None) -> int:
    """Run, print the table, write the JSON. Exit 1 below ``--min-accuracy``; with ``--scripted``,
    exit 1 when a question the oracle answers right failed or one it answers wrong passed."""
    args = parser().parse_args(argv)
    all_questions = questions(generate())
    check_unique_ids(all_questions)
    if args.list:
        for q in all_questions:
            print(f"{q.id:<26} {', '.join(q.files):<30} {q.check.describe()}")
        return 0
    if not args.scripted and not (args.base_url and args.model):
        parser().error("--base-url and --model are required (or --scripted for the self-test)")
    if args.wrong and not args.scripted:
        parser().error("--wrong needs --scripted")
    selected = select(all_questions, args.only)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.time()
    outcomes = asyncio.run(_main(args, selected))
    summary = totals(outcomes)
    document = {
        "model": "scripted-oracle" if args.scripted else args.model,
        "base_url": None if args.scripted else args.base_url,
        "scripted": args.scripted,
        "wrong": sorted(args.wrong),
        "sandbox": args.sandbox,
        "seed": SEED,
        "max_rounds": args.max_rounds,
        "started_at": started,
        "duration_s": time.time() - started,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        **summary,
        "results": [o.__dict__ for o in outcomes],
    }
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    print(table(outcomes))
    if args.scripted:
        wrong = set(args.wrong)
        unexpected = [o.id for o in outcomes if o.passed == (o.id in wrong)]
        if unexpected:
            print(f"self-test FAILED: unexpected result for {', '.join(unexpected)}", file=sys.stderr)
            return 1
        return 0
    return 1 if summary["accuracy"] < args.min_accuracy else 0


if __name__ == "__main__":
    sys.exit(main())
