"""The plain local launcher (``sandbox: none``): ipykernel processes on this host with rlimits
and a cgroup each (:mod:`.launcher`). A launcher: it composes the spawner (:mod:`kernels.spawn`)
and imports no other launcher."""
