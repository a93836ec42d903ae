"""The plain local launcher (``sandbox: none``): ipykernel processes on this host with rlimits
and a cgroup each (:mod:`.launcher`). A launcher: it imports no other launcher."""
