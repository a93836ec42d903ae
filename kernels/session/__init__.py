"""One thread's kernel: the session that runs its cells (:mod:`.session`), the outputs one
execution collects (:mod:`.output`), the workspace-quota probe (:mod:`.quota_probe`) and the
snapshots that let its variables outlive the kernel (:mod:`.snapshots`)."""
