"""Kernels started ahead of their threads: the warm pool (:mod:`.pool`) and how many to keep
(:mod:`.target`)."""
