"""Fork-server kernels, the bot's side (:mod:`.launcher`): a launcher that forks kernels from a
pre-imported zygote (the program in ``kernels/fork/``) and falls back to the spawning launcher
it wraps. A launcher: it imports no other launcher."""
