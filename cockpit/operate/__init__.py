"""The workflows that drive a monitor: relaunch and ablation, bisect, the hang bundle, the snapshot
document. They sit above the monitor (cockpit/monitor/) and below the interfaces (ui, serve,
exporter, cli); nothing below takes a monitor."""
