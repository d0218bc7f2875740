"""What the operator does to a run through the agent, planned and then carried out exactly as
planned: kill and verify, /dev/shm audit and clean, every rank's stack and flight-recorder dump,
launch, relaunch and ablation, a stall's forensics, the hang bundle."""
