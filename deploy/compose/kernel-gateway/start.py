"""Start the Jupyter Kernel Gateway as a process that cannot be dumped (``PR_SET_DUMPABLE`` 0):
its kernels run as the same uid, and would otherwise read its environment (``KG_AUTH_TOKEN``)
and memory through ``/proc``. Refuses to start the gateway when that cannot be set."""

import ctypes
import sys

PR_SET_DUMPABLE = 4

if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
    sys.exit(f"kernel gateway: cannot make itself non-dumpable (errno {ctypes.get_errno()}); not starting")

from kernel_gateway import launch_instance  # noqa: E402 - only once the process is not dumpable

sys.exit(launch_instance())
