"""Transports to a host: the local machine, ssh, containers and Slurm nodes; nothing here knows frames."""
