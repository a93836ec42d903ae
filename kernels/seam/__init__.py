"""The seam, the bottom floor of ``kernels/``: what every other floor speaks and nothing here
carries out. The launch seam (:mod:`.plan`: the :class:`~kernels.seam.plan.Launcher` and
:class:`~kernels.seam.plan.KernelHandle` protocols, one frozen
:class:`~kernels.seam.plan.LaunchPlan` per start), the ``kernels:`` settings (:mod:`.settings`),
a channel's kernel options (:mod:`.options`), results and errors (:mod:`.result`) and sizes
for people (:mod:`.units`). Nothing here imports another floor."""
