"""Reading what a host says, pure: log lines (engine prefixes, failures, phases), the engine's
Prometheus metrics, NCCL RAS answers, py-spy stack dumps, torch flight-recorder dumps; each reading
turns into `Finding`s where it has something to say about the run. No I/O, no host state."""
