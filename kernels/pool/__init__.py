"""The kernel pool: thread key → kernel session, with its limits, queue and saves
(:mod:`.pool`), and the reaper that culls idle kernels and stale workspaces (:mod:`.reaper`)."""
