"""One thread's kernel: the session that holds it (:mod:`.session`), the kernel process it
coordinates (:mod:`.process`), one cell (:mod:`.cell`) and its run, and the bot's own questions
(:mod:`.execution`), what the thread is told (:mod:`.notices`), the outputs one execution
collects (:mod:`.output`), the workspace-quota probe (:mod:`.quota_probe`) and the snapshots
that let its variables outlive the kernel (:mod:`.snapshots`)."""
