"""The bubblewrap sandbox: every kernel in its own namespaces, as an unprivileged uid.

Each kernel runs as ``bwrap [namespaces, binds] -- [sh -c remount] prlimit [limits] -- [setpriv]
-- python -m ipykernel_launcher``, in its own cgroup where the host allows one
(:mod:`kernels.host.cgroups`; the bot's ``preexec_fn`` puts the bwrap process there):

* new pid, net, ipc, uts and cgroup namespaces; only ``lo`` exists, so there is no network
  and the bot's own ports on the host's 127.0.0.1 are unreachable (``network: true``
  kernels also get slirp4netns's ``tap0``, see :mod:`kernels.sandbox.slirp`);
* read-only binds of ``/usr``, the Python installation and the virtualenv (at their own
  paths, parents created ``0755`` so an unprivileged uid can reach them), a few files from
  ``/etc`` and a generated ``/etc/passwd``; nothing else of the host is visible;
* the thread's workspace at ``/workspace`` (cwd, ``HOME``) is the only persistent writable
  place; ``/tmp`` and ``/dev/shm`` are size-capped tmpfs (inode-capped too when the bot is
  root: bwrap has no option for it, so a ``sh`` step still root inside the sandbox remounts
  them with ``nr_inodes`` before ``setpriv``); the channel's ``data_dir`` is bound
  read-only at ``/data``; the per-kernel run dir (ZMQ ipc sockets, connection file) is bound
  at its own path;
* ``--die-with-parent``, ``--new-session``, message-mode interrupts, rlimits set by
  ``prlimit`` inside the sandbox (limits set on the bwrap pid would not reach its child).

Who the kernel is depends on who runs the bot:

* **root** (this repo's dev machines): bwrap keeps the host user namespace, so
  ``setpriv`` drops to a per-workspace uid/gid (``KERNEL_UID_BASE`` + hash), clears
  groups, empties every capability set and sets ``no_new_privs``. The workspace and run
  dir are chowned to that uid before the start.
* **non-root** (the Docker image, uid 10001): bwrap creates an unprivileged user namespace
  (``--unshare-user --uid 1000``, every capability dropped, ``no_new_privs`` set by bwrap)
  and, where supported, ``--disable-userns`` forbids nested user namespaces. That uid owns
  the tmpfs under ``/`` and ``/dev``, so both are remounted read-only. Nothing in the
  sandbox keeps the capability to remount ``/tmp`` and ``/dev/shm``, so they have a size
  cap but no inode cap; their inode memory counts against the kernel's memory cgroup where
  there is one.

``sandbox: auto`` and ``sandbox: bwrap`` probe once (a real sandboxed Python start) and fail
closed: when the probe fails, start-up stops with :class:`~kernels.seam.result.SandboxUnavailableError`, one line
naming the fix (:mod:`kernels.sandbox.remedy`); only ``sandbox: none``, written by the
operator, runs kernels without a sandbox.
For ``network: true`` the same start-up probes slirp4netns (:mod:`kernels.sandbox.slirp`); without
it such kernels stay offline and the launcher warns once, saying what to install.

The package, one concept per module:

* :mod:`kernels.sandbox.support` - finding bwrap and its features, the host's layout;
* :mod:`kernels.sandbox.args` - the bwrap command lines (pure functions);
* :mod:`kernels.sandbox.identity` - the kernel's uid and its files on the host;
* :mod:`kernels.sandbox.probe` - the start-up probes;
* :mod:`kernels.sandbox.remedy` - the one line that says what to do when it cannot start;
* :mod:`kernels.sandbox.slirp` - the network of ``network: true`` kernels (slirp4netns).

The launcher whose kernels run in it is :class:`kernels.bwrap.launcher.BwrapLauncher`; which launcher
a deployment gets is chosen in :func:`kernels.build.build_launcher`.
"""
