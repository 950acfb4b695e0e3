"""The parties of a deployment and how they trust one another.

`identity` (a key pair and X.509 certificate per node and driver; mutual TLS),
`peers` (which party is on the other end of a connection, and in which role),
`commitments` (private constants hidden from parties that may not see them, and
the digests and votes by which parties agree on one program) and `local`
(development clusters on one machine: specs, keys and worker processes,
``mplang init`` and ``mplang up``).
"""
