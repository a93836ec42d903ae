"""Host facilities: what the bot does on this machine for kernels, whoever starts them.

Per-kernel cgroups (:mod:`.cgroups`), freezes between turns (:mod:`.freezing`), processes a
cell left (:mod:`.leftovers`) and process trees (:mod:`.proctree`), the kernel interpreter
(:mod:`.interpreter`), the kernel warden that kills kernels when the bot dies
(:mod:`.lifeline`, :mod:`.warden`), where kernels' run dirs live (:mod:`.runroot`), the mount
table (:mod:`.mounts`), the one way to touch kernel-writable places (:mod:`.safefs`),
threads' workspaces (:mod:`.workspace`) and packages on demand (:mod:`.packages`). Imports
only the seam."""
