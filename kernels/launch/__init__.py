"""Starting kernels: the launch seam (:mod:`.plan`), local kernels (:mod:`.local`), kernels on a
Jupyter gateway (:mod:`.gateway`), the kernel interpreter (:mod:`.interpreter`) and what confines a
started kernel's processes (per-kernel :mod:`.cgroups`, :mod:`.freezing` between turns,
:mod:`.leftovers` killed after a cell, and the kernel warden that kills them when the bot dies:
:mod:`.lifeline`, :mod:`.warden`)."""
