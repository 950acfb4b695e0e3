"""Worker side of the ``simp`` dialect: state, kernels, in-memory mesh, HTTP server."""
