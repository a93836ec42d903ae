"""Kernels on a Jupyter gateway (:mod:`.launcher`): the same launch seam carried out over the
gateway's REST and websocket API. A launcher: it imports no other launcher."""
