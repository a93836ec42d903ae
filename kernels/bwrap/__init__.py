"""The sandboxed launcher (:mod:`.launcher`): kernels spawned inside bubblewrap, from the
pieces of :mod:`kernels.sandbox` by the spawner it composes (:mod:`kernels.spawn`). A launcher:
it imports no other launcher."""
