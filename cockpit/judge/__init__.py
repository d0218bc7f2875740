"""Judging a HostState: the run's phase and the watchdog's verdict with its evidence, the findings
of the readings folded in, and a saved log's post-mortem. Pure: nothing here talks to a host."""
