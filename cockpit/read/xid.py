"""What an Xid code means and what an operator does next: the codes an inference run meets most,
from NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors; docs/xid.md is the same table for
people). One table, read by the verdict's evidence, the GPU pane, the fleet row and the bundle."""

from __future__ import annotations

# code -> (what it is, what to do next)
XID: dict[int, tuple[str, str]] = {
    13: (
        "graphics engine exception",
        "usually the application (an illegal access): restart it; on many apps, check the GPU",
    ),
    31: ("GPU memory page fault", "usually the application (a bad address): restart it, debug with compute-sanitizer"),
    43: ("GPU stopped processing (the app faulted)", "restart the application; the GPU is fine"),
    45: ("preemptive cleanup after earlier errors", "look for the Xid before it; the GPU is fine"),
    48: ("double-bit ECC error", "restart the app; reset the GPU; replace it if it recurs"),
    61: ("internal micro-controller warning", "reset the GPU; contact support if it recurs"),
    62: ("internal micro-controller halt", "reset the GPU (or reboot); contact support"),
    63: ("row remap / page retirement recorded", "reset the GPU when the run ends to apply it"),
    64: ("row remap / page retirement failed", "drain the node, reset the GPU; replace it if it recurs"),
    74: ("NVLink error", "reset the GPU; check NVLink/NVSwitch and the fabric manager"),
    79: ("fallen off the bus", "drain the node and reboot; check PCIe, power and cooling; replace if it recurs"),
    92: ("high single-bit ECC error rate", "watch it; replace the GPU if it persists"),
    94: ("contained ECC error", "restart the apps on that GPU; reset it when possible"),
    95: ("uncontained ECC error", "drain the node and reset the GPU"),
    119: ("GSP RPC timeout", "reset the GPU or reboot; update the driver; contact support"),
    120: ("GSP error", "reset the GPU or reboot; contact support"),
    154: ("GPU recovery action changed", "do the action the driver names (reset, reboot, drain)"),
}
LOST = "fallen off the bus"  # what a GPU that NVML reports lost has done


def meaning(code: int) -> str:
    """`79 (fallen off the bus)`, or the bare code when the table does not have it."""
    found = XID.get(code)
    return f"{code} ({found[0]})" if found else str(code)


def action(code: int) -> str | None:
    found = XID.get(code)
    return found[1] if found else None
