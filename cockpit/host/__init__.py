"""One host's state and the session that keeps it: frames from the agent turned into a HostState,
commands sent and answered, the snapshot document written from (and read back into) a HostState."""
