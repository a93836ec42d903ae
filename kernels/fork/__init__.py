"""The fork programs: the kernels' pre-imported parent (``zygote.py``), the one-shots' parent
(``oneshot_zygote.py``) and the jail a forked child enters before any user code (``jail.py``).

Each imports only the standard library and is run or loaded by path: the sandboxed zygotes
bind this folder read-only for themselves (and hide it from every child), so it holds nothing
but standard-library code of theirs. The bot's side lives elsewhere (:mod:`kernels.forking`,
:mod:`kernels.oneshot.server`); it finds the programs by the paths named here."""

from __future__ import annotations

from pathlib import Path

#: This folder (bound into a sandboxed zygote when no Python folder holds it).
FOLDER = Path(__file__).parent
#: The kernels' zygote.
ZYGOTE = FOLDER / "zygote.py"
#: The one-shots' zygote.
ONESHOT_ZYGOTE = FOLDER / "oneshot_zygote.py"
