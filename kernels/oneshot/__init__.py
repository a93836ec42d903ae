"""The bot's own work on untrusted data in fresh, sandboxed one-shot processes: the runner
(:mod:`.runner`) and the one-shot fork server it forks them from where it can (:mod:`.server`)."""
