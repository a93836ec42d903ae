"""Charts and vector images to PNG, inside the kernel, with no browser download.

* SVG → PNG with vl-convert's resvg (``vl_convert.svg_to_png``), at a scale chosen from
  the size the SVG declares so the picture stays within :data:`MAX_SIDE` pixels.
* Vega-Lite / Vega → SVG with vl-convert's bundled engine, then as above.
* Plotly → PNG with kaleido 0.2.1's bundled Chromium, one short-lived process per figure
  (run in its own process group, killed on timeout) with a private ``HOME`` in the
  temporary folder, so nothing lands in the workspace and nothing outlives the cell.

Every renderer raises :class:`RenderError` with a short reason on failure, time-out or
oversized input; the caller keeps the original bundle. Modules are imported on first use
only: a kernel that never draws a chart never loads them.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "MAX_SIDE",
    "RENDER_TIMEOUT_S",
    "RenderError",
    "plotly_to_png",
    "svg_to_png",
    "vega_to_png",
    "vegalite_to_png",
]

#: Longest side of a rendered PNG, in pixels; larger pictures are scaled down.
MAX_SIDE = 4096
#: Most pixels of a rendered PNG.
MAX_PIXELS = 12_000_000
#: Preferred scale (crisp on high-density screens) when the picture is small enough.
SCALE = 2.0
#: Largest SVG text rendered.
MAX_SVG_CHARS = 8_000_000
#: Largest chart spec (JSON) rendered.
MAX_SPEC_CHARS = 16_000_000
#: Longest one render may take.
RENDER_TIMEOUT_S = 20.0

_CHROMIUM_ARGS = (
    # Inside bubblewrap there are no user namespaces and no setuid helper for Chromium's own
    # sandbox, and one process keeps the kernel's process limit in reach.
    "--no-sandbox",
    "--single-process",
    "--no-zygote",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-breakpad",
    "--disable-crash-reporter",
    "--allow-file-access-from-files",
)
_PLOTLY_SIZE = (700, 500)  # plotly's default figure size

T = TypeVar("T")


class RenderError(Exception):
    """A render failed, timed out or was refused; ``str()`` is a short reason for people."""


def svg_to_png(svg: str) -> bytes:
    """PNG of an SVG document, scaled to fit :data:`MAX_SIDE` / :data:`MAX_PIXELS`."""
    if len(svg) > MAX_SVG_CHARS:
        raise RenderError(f"the SVG is too large to render ({len(svg):,} characters)")
    width, height = svg_size(svg)
    scale = fit_scale(width, height)
    svg = with_namespace(svg)
    import vl_convert

    return _bounded(lambda: bytes(vl_convert.svg_to_png(svg, scale=scale)), "SVG")


def vegalite_to_png(spec: dict[str, Any]) -> bytes:
    """PNG of a Vega-Lite spec (the version named by its ``$schema`` where available)."""
    _check_spec(spec)
    import vl_convert

    version = _vegalite_version(spec, list(vl_convert.get_vegalite_versions()))
    svg = _bounded(lambda: str(vl_convert.vegalite_to_svg(spec, vl_version=version)), "Vega-Lite chart")
    return svg_to_png(svg)


def vega_to_png(spec: dict[str, Any]) -> bytes:
    """PNG of a Vega spec."""
    _check_spec(spec)
    import vl_convert

    svg = _bounded(lambda: str(vl_convert.vega_to_svg(spec)), "Vega chart")
    return svg_to_png(svg)


def plotly_to_png(figure: dict[str, Any]) -> bytes:
    """PNG of a Plotly figure (its JSON: ``data``, ``layout``) rendered by kaleido's Chromium."""
    found = figure.get("layout")
    layout: dict[str, Any] = found if isinstance(found, dict) else {}
    width = _number(layout.get("width")) or _PLOTLY_SIZE[0]
    height = _number(layout.get("height")) or _PLOTLY_SIZE[1]
    scale = fit_scale(width, height)
    request = json.dumps(
        {
            "data": {"data": figure.get("data", []), "layout": layout},
            "format": "png",
            "width": width,
            "height": height,
            "scale": scale,
        }
    )
    if len(request) > MAX_SPEC_CHARS:
        raise RenderError(f"the figure is too large to render ({len(request):,} characters of JSON)")
    folder, plotlyjs = _kaleido_paths()
    args = [str(folder / "bin" / "kaleido"), "plotly", f"--plotlyjs={plotlyjs}", *_CHROMIUM_ARGS]
    response = _run_kaleido(args, folder, request + "\n")
    if response.get("code", 1) != 0 or not isinstance(response.get("result"), str):
        raise RenderError(f"kaleido could not render the figure: {str(response.get('message'))[:200]}")
    return base64.b64decode(response["result"])


def fit_scale(width: float, height: float) -> float:
    """The scale (at most :data:`SCALE`) that keeps ``width`` × ``height`` within the caps."""
    if not (width > 0 and height > 0 and math.isfinite(width) and math.isfinite(height)):
        raise RenderError("the picture has no usable size")
    scale = min(SCALE, MAX_SIDE / max(width, height), math.sqrt(MAX_PIXELS / (width * height)))
    if width * scale < 1 or height * scale < 1:
        raise RenderError(f"the picture's shape is too extreme to render ({width:g} × {height:g})")
    return scale


_SVG_TAG = re.compile(r"<svg\b[^>]*>", re.IGNORECASE)
_LENGTH = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z%]*)\s*$", re.IGNORECASE)
_UNITS = {
    "": 1.0,
    "px": 1.0,
    "pt": 4 / 3,
    "pc": 16.0,
    "mm": 96 / 25.4,
    "cm": 96 / 2.54,
    "in": 96.0,
    "em": 16.0,
    "ex": 8.0,
}


def svg_size(svg: str) -> tuple[float, float]:
    """The size in pixels an SVG declares on its root element (``width``/``height``, else its
    ``viewBox``, else resvg's 100 × 100)."""
    tag = _SVG_TAG.search(svg, 0, 200_000)
    if tag is None:
        raise RenderError("this is not an SVG document (no <svg> element)")
    attrs = {m.group(1).lower(): m.group(2) for m in re.finditer(r"([\w:-]+)\s*=\s*[\"']([^\"']*)[\"']", tag.group())}
    box = [float(v) for v in re.findall(r"[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?", attrs.get("viewbox", ""))]
    box_size = (box[2], box[3]) if len(box) == 4 else None
    sizes: list[float] = []
    for index, name in enumerate(("width", "height")):
        match = _LENGTH.match(attrs.get(name, ""))
        if match and match.group(2).lower() in _UNITS:
            sizes.append(float(match.group(1)) * _UNITS[match.group(2).lower()])
        elif box_size is not None:
            sizes.append(box_size[index])
        else:
            sizes.append(100.0)
    return sizes[0], sizes[1]


def with_namespace(svg: str) -> str:
    """``svg`` with the SVG namespace declared on its root element: HTML front ends draw an
    ``<svg>`` without it (``IPython.display.SVG('<svg width=…>')``), resvg refuses it."""
    tag = _SVG_TAG.search(svg, 0, 200_000)
    if tag is None or re.search(r"\sxmlns\s*=", tag.group()):
        return svg
    start = tag.start() + len("<svg")
    return f'{svg[:start]} xmlns="http://www.w3.org/2000/svg"{svg[start:]}'


def _check_spec(spec: dict[str, Any]) -> None:
    size = len(json.dumps(spec))
    if size > MAX_SPEC_CHARS:
        raise RenderError(f"the chart spec is too large to render ({size:,} characters of JSON)")


def _vegalite_version(spec: dict[str, Any], available: list[str]) -> str | None:
    """The bundled Vega-Lite version matching the spec's ``$schema`` (same minor, else the
    newest of the same major); None: vl-convert's default."""
    match = re.search(r"vega-lite/v(\d+)(?:\.(\d+))?", str(spec.get("$schema", "")))
    if not match:
        return None
    major, minor = match.group(1), match.group(2)
    if minor is not None and f"{major}.{minor}" in available:
        return f"{major}.{minor}"
    same_major = [v for v in available if v.split(".")[0] == major]
    return max(same_major, key=lambda v: tuple(int(p) for p in v.split("."))) if same_major else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _bounded(render: Callable[[], T], what: str) -> T:
    """``render()`` in a worker thread, given up after :data:`RENDER_TIMEOUT_S` (the kernel
    stays interruptible while it waits)."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = render()
        except Exception as exc:
            box["error"] = exc

    worker = threading.Thread(target=work, name="threadbook-render", daemon=True)
    worker.start()
    worker.join(RENDER_TIMEOUT_S)
    if worker.is_alive():
        raise RenderError(f"rendering the {what} took over {RENDER_TIMEOUT_S:g} s")
    if "error" in box:
        raise RenderError(f"could not render the {what}: {_short(box['error'])}")
    value: T = box["value"]
    return value


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def _kaleido_paths() -> tuple[Path, str]:
    """kaleido's executable folder and plotly's bundled plotly.js (no CDN is ever asked)."""
    kaleido = importlib.util.find_spec("kaleido")
    plotly = importlib.util.find_spec("plotly")
    if kaleido is None or kaleido.origin is None:
        raise RenderError("kaleido is not installed")
    if plotly is None or plotly.origin is None:
        raise RenderError("plotly is not installed")
    folder = Path(kaleido.origin).parent / "executable"
    plotlyjs = Path(plotly.origin).parent / "package_data" / "plotly.min.js"
    if not (folder / "bin" / "kaleido").exists() or not plotlyjs.exists():
        raise RenderError("kaleido's Chromium or plotly.js is missing")
    return folder, str(plotlyjs)


def _run_kaleido(args: list[str], folder: Path, request: str) -> dict[str, Any]:
    """One kaleido process for one request: its JSON response. The process group is killed
    and waited for whatever happens (time-out, interrupt), so no Chromium outlives the render."""
    with tempfile.TemporaryDirectory(prefix="threadbook-kaleido-") as home:
        # What kaleido's own launcher script sets, without the script: the binary is our direct
        # child, so killing and reaping it leaves nothing behind.
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
        library_path = os.pathsep.join(filter(None, [str(folder / "lib"), env.get("LD_LIBRARY_PATH")]))
        env.update(
            HOME=home,
            XDG_CONFIG_HOME=home,
            XDG_CACHE_HOME=home,
            TMPDIR=home,
            LD_LIBRARY_PATH=library_path,
            FONTCONFIG_PATH=str(folder / "etc" / "fonts"),
            XDG_DATA_HOME=str(folder / "xdg"),
        )
        with open(os.path.join(home, "stderr"), "w+b") as errors:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                env=env,
                cwd=folder,
                process_group=0,
                close_fds=True,
            )
            try:
                out, _ = proc.communicate(request.encode(), timeout=RENDER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise RenderError(f"rendering the Plotly figure took over {RENDER_TIMEOUT_S:g} s") from None
            finally:
                _kill_group(proc)
            errors.seek(0)
            stderr = errors.read(4000).decode(errors="replace")
    for line in reversed(out.splitlines()):
        try:
            response = json.loads(line)
        except ValueError:
            continue
        if isinstance(response, dict) and "result" in response and response.get("result") is not None:
            return response
        if isinstance(response, dict) and response.get("code", 0) != 0:
            return response
    last = [line for line in stderr.splitlines() if line.strip()][-1:] or [f"exit status {proc.returncode}"]
    raise RenderError(f"kaleido gave no image ({last[0][:200]})")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc``'s process group, reap ``proc`` and wait (briefly) until the group is gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        proc.kill()
    proc.wait()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.01)
