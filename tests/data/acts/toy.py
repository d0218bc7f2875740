"""A toy act, as a plug-in module adds one: one row of the table of acts and one workflow. It asks
the live run's package versions through an existing monitor verb, asking first (it is marked
dangerous, so the confirm path is exercised), and reports them."""

from cockpit.operate import acts, perform

acts.register(
    acts.Act(
        "versions",
        "V",
        "Versions",
        "the live run's package versions, as its ranks import them",
        "Versions: the run's packages",
        "versions",
        "act",
        "the live run's package versions, as its ranks import them",
        asks=True,
    )
)


@perform.workflow("versions")
async def versions(monitor, asker):
    if not await asker.confirm("versions", [f"ask {monitor.target.label} for the run's versions"], "ask?"):
        return None
    asker.under_way("asking")
    found = await monitor.run_versions()
    asker.tell(f"asked {monitor.target.label}")
    return perform.Outcome(f"{len(found)} facts", [f"{k}: {v}" for k, v in sorted(found.items())], {"versions": found})
