"""Driver side of the ``simp`` dialect: HostVar, kernels, in-memory and HTTP drivers."""
