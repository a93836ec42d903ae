"""Fork-server kernels: the bot's side (:mod:`.server`), the pre-imported program it runs
(``zygote.py``) and the per-kernel jail a forked child enters before any user code (``jail.py``).

``zygote.py`` and ``jail.py`` import only the standard library and are loaded by path, so this
folder holds nothing else the sandboxed zygote would see."""
