"""`python -m bot console` driven through a pipe, as a script would; and the CLI's clear errors."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import yaml
from PIL import Image

from tests.conftest import kernel_config
from tests.fakes.openai_server import ScriptedOpenAI, answer, tool_call

REPO = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, llm_url: str) -> Path:
    config = {
        "llm": {"base_url": llm_url, "api_key": "test-key", "model": "fake-model", "max_retries": 0},
        "kernels": kernel_config(tmp_path),
        "storage": {"path": str(tmp_path / "data" / "tb.db")},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def run_cli(*args: str, stdin: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    out, err = await asyncio.wait_for(process.communicate(stdin.encode()), 90)
    return process.returncode or 0, out.decode(), err.decode()


async def test_console_through_a_pipe_attaches_plots_saves_and_resumes(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("x,y\n1,2\n2,4\n3,9\n")
    async with ScriptedOpenAI() as llm:
        config = write_config(tmp_path, llm.base_url)
        llm.script(
            tool_call(
                "import pandas as pd, matplotlib.pyplot as plt\ndf = pd.read_csv('data.csv')\ndf.plot(x='x', y='y')\nplt.show()"
            ),
            answer("Here is y against x."),
        )
        code, out, err = await run_cli(
            "console",
            "--config",
            str(config),
            "--out",
            str(tmp_path / "out"),
            "--thread",
            "demo",
            stdin=f"/attach {tmp_path / 'data.csv'}\nplot y against x\n",
            cwd=tmp_path,
        )
        assert code == 0, err
        assert "Here is y against x." in out
        saved = [line.removeprefix("saved: ") for line in out.splitlines() if line.startswith("saved: ")]
        assert len(saved) == 1
        assert Image.open(saved[0]).format == "PNG"
        assert "you>" not in out  # no prompts when stdin is a pipe

        llm.script(
            tool_call("print(len(open('data.csv').read().splitlines()))"),
            lambda r: answer("lines: " + r["messages"][-1]["content"]),
        )
        code, out, err = await run_cli(
            "console",
            "--config",
            str(config),
            "--out",
            str(tmp_path / "out"),
            "--thread",
            "demo",
            stdin="how many lines?\n",
            cwd=tmp_path,
        )
        assert code == 0, err
        assert "lines:" in out and "4" in out
        assert any("plot y against x" in str(m.get("content")) for m in llm.requests[-1]["messages"])


async def test_cli_reports_config_errors_and_missing_platforms_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("llm: {base_url: 'http://127.0.0.1:1/v1', max_rounds: 0}\n")
    code, _, err = await run_cli("run", "--config", str(bad), stdin="", cwd=tmp_path)
    assert code == 2
    assert "config: llm.max_rounds:" in err

    config = write_config(tmp_path, "http://127.0.0.1:1/v1")
    code, _, err = await run_cli(
        "run", "--config", str(config), stdin="", cwd=tmp_path, env={"SLACK_BOT_TOKEN": "", "DISCORD_BOT_TOKEN": ""}
    )
    assert code == 2
    assert "No chat platform is configured" in err and "make console" in err


async def test_console_survives_a_bad_attach_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:1/v1")
    code, out, err = await run_cli(
        "console",
        "--config",
        str(config),
        "--out",
        str(tmp_path / "out"),
        stdin='/attach "unclosed\n/attach missing.csv\n',
        cwd=tmp_path,
    )
    assert code == 0, err
    assert "not attached: No closing quotation" in out
    assert "not attached: missing.csv is not a file" in out


async def test_console_thread_keeps_its_variables_across_a_restart(tmp_path: Path) -> None:
    """`console --thread NAME` twice: the first run's variables (a number, a DataFrame, a
    function, a fitted model, an instance of the thread's own class) are back in the second,
    the model is told which names were restored and which open file was lost, and `status`
    shows the snapshot; `reset` forgets it."""
    define = (
        "import pandas as pd\nfrom sklearn.linear_model import LinearRegression\n"
        "x = 7\ndf = pd.DataFrame({'a': [1.0, 2.0, 3.0], 'b': [2.0, 4.0, 6.0]})\n"
        "def double(v):\n    return 2 * v\n"
        "class Box:\n    def __init__(self, v):\n        self.v = v\n"
        "box = Box(5)\nmodel = LinearRegression().fit(df[['a']], df['b'])\nlog = open('log.txt', 'w')"
    )
    use = "print(x, df.b.sum(), double(x), box.v, round(float(model.predict(pd.DataFrame({'a': [10.0]}))[0]), 2))"
    async with ScriptedOpenAI() as llm:
        config = write_config(tmp_path, llm.base_url)
        args = ("console", "--config", str(config), "--out", str(tmp_path / "out"), "--thread", "keep")
        llm.script(tool_call(define), answer("Defined."))
        code, out, err = await run_cli(*args, stdin="define things\n", cwd=tmp_path)
        assert code == 0, err

        llm.script(tool_call(use), lambda r: answer("got " + r["messages"][-1]["content"]))
        code, out, err = await run_cli(*args, stdin="use them\nstatus\n", cwd=tmp_path)
        assert code == 0, err
        assert "7 12.0 14 5 20.0" in out
        system = llm.requests[-2]["messages"][0]["content"]
        for restored in (
            "`x` (int)",
            "`df` (DataFrame 3×2)",
            "`double` (function)",
            "`Box` (class)",
            "`box` (Box)",
            "`model` (LinearRegression)",
        ):
            assert restored in system
        assert "Not restored: `log` (it is an open file handle" in system
        assert "Saved variables:** " in out and "Saved variables:** none" not in out

        llm.script(tool_call("print('x' in dir())"), lambda r: answer("now " + r["messages"][-1]["content"]))
        code, out, err = await run_cli(*args, stdin="reset\n", cwd=tmp_path)
        assert code == 0, err
        code, out, err = await run_cli(*args, stdin="still there?\n", cwd=tmp_path)
        assert code == 0, err
        assert "False" in out.split("now", 1)[1]


async def test_the_console_shows_no_host_path(tmp_path: Path) -> None:
    """A traceback the model quotes names no folder of the server (issue 31)."""
    async with ScriptedOpenAI() as llm:
        config = write_config(tmp_path, llm.base_url)
        kernels = kernel_config(tmp_path)
        llm.script(
            tool_call("import pandas as pd\npd.read_csv('missing.csv')"),
            lambda r: answer("It failed: " + r["messages"][-1]["content"] + f" (in {kernels['workspace_root']}/t1)"),
        )
        code, out, err = await run_cli(
            "console",
            "--config",
            str(config),
            "--out",
            str(tmp_path / "out"),
            "--thread",
            "paths",
            stdin="read missing.csv\n",
            cwd=tmp_path,
        )
        assert code == 0, err
        assert "FileNotFoundError" in out and "site-packages/pandas" in out
        venv = os.path.dirname(os.path.dirname(os.path.abspath(kernels["python"])))
        for folder in (venv, str(kernels["workspace_root"]), str(REPO)):
            assert folder not in out


#: An answer steered by a hostile upload: a clipboard write (OSC 52), a hyperlink (OSC 8), a
#: window title, a screen clear, colours, a DCS string and 8-bit CSI/OSC.
HOSTILE = (
    "Total: \x1b]52;c;cm0gLXJmIH4K\x07 42 \x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\ "
    "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m \x1bP+q544e\x1b\\\x9b2J\x9d0;x\x9cend\r\nover"
)
#: What a terminal would obey in any of it.
CONTROL = ("\x1b", "\x07", "\x9b", "\x9c", "\x9d", "\x90", "\r")


async def test_the_console_through_a_pipe_prints_no_terminal_control(tmp_path: Path) -> None:
    """Answers, live output, notices and file names reach stdout without the control sequences
    in them (their printable text stays), in pipe mode as on a terminal."""
    async with ScriptedOpenAI() as llm:
        config = write_config(tmp_path, llm.base_url)
        llm.script(
            tool_call(f"print({HOSTILE!r})\nopen('\\x1b]0;t\\x07.txt', 'w').write('x')"),
            answer(HOSTILE),
        )
        code, out, err = await run_cli(
            "console",
            "--config",
            str(config),
            "--out",
            str(tmp_path / "out"),
            stdin="what is the total?\n",
            cwd=tmp_path,
        )
    assert code == 0, err
    assert not [c for c in CONTROL if c in out], repr(out)
    assert "Total:" in out and "42" in out and "click" in out and "red" in out and "end" in out
    assert "saved:" in out and "\\x1b]0;t\\x07.txt" in out  # the file's name, escaped visibly
