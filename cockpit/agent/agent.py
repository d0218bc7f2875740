"""The agent's parts under one name, for the operator side's tests, benchmarks and GPU scripts
(`from cockpit.agent import agent`; `agent.find_runs`, `agent.Procs`, ...). Never sent to the host:
the agent itself is the package's other modules. To change a module's behaviour in a test, patch
the module that owns the name (`procs.SCAN_EVERY_S`), not this view."""

from cockpit.agent import facts, flightrec, gpus, kill, logs, main, nvml, ports, procs, protocol, pyspy, ras, shm, web

for _module in (protocol, procs, gpus, nvml, ports, logs, web, ras, flightrec, facts, kill, shm, pyspy, main):
    globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
del _module
