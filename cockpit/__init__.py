"""gpu-cockpit: a terminal cockpit for multi-GPU inference hosts."""

__version__ = "0.1.0"
