"""One thread's kernel: the session that holds it (:mod:`.session`), one cell's run in it
(:mod:`.execution`), the outputs one execution collects (:mod:`.output`), the workspace-quota
probe (:mod:`.quota_probe`) and the snapshots that let its variables outlive the kernel
(:mod:`.snapshots`)."""
