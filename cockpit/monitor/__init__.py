"""Watching: one host (HostMonitor), a run spanning Slurm nodes (ClusterMonitor), a saved snapshot
(ReplayMonitor), many hosts (FleetMonitor), and the built-in simulated demo host. Every screen and
headless command reads a monitor; every monitor keeps the `Monitor` protocol."""
