"""The kernel pool: thread key → kernel session, with its limits, leases and saves
(:mod:`.pool`), the line of threads waiting for a kernel (:mod:`.queue`), and the reaper that
culls idle kernels and stale workspaces (:mod:`.reaper`)."""
