"""The execution core: what runs a graph on one party or the driver.

`interpreter` dispatches each op to the kernel registered on its primitive,
`scheduler` runs independent ops concurrently, `backend` holds the kernels and
per-worker state of each dialect, `options` says how one execution runs,
`timeline` records what every interpreter did, `object_store` keeps values that
outlive an execution and `sandbox` checks native payloads in a helper process
before a kernel parses them.
"""
