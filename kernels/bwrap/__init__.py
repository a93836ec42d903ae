"""The sandboxed launcher (:mod:`.launcher`): kernels spawned inside bubblewrap, from the
pieces of :mod:`kernels.sandbox`. A launcher: it imports no other launcher."""
