"""The process spawner every local launcher composes (the floor below the launchers).

:mod:`~kernels.spawn.environment` is a kernel's environment and its first steps between fork
and exec; :mod:`~kernels.spawn.process` the ``jupyter_client`` provisioner that owns one kernel
process (its ``Popen``, cgroup, warden registration and whole-tree kill);
:mod:`~kernels.spawn.handle` the handle of a started local kernel; and
:mod:`~kernels.spawn.spawner` the :class:`~kernels.spawn.spawner.Spawner` that carries a plan
out with them. The local, bubblewrap and forking launchers each hold a spawner and differ only
in the plan they make and the provisioner they hand it; none subclasses another.
"""
