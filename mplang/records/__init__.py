"""Files that record what executions did: a worker's audit log of what ran there and
what left or reached its party (`audit`), and runs' timelines as Chrome / Perfetto
trace files (`trace_file`)."""
