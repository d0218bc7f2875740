"""Every first look at the demo stalled for a minute says stalled, since when and why, and none says
`ok`: `snapshot` in JSON (its default look, the instant `--wait 0`, `--wait 3`), as text and SVG
(the screen opened late, headless), the demo's fleet row, the hang bundle's verdict.json and
`explain` of the run's own log. Real processes: the demo's simulated server, its log, its port."""

from __future__ import annotations

import json
import tarfile
import time
from pathlib import Path

from conftest import run_cli
from simhost import until

from cockpit.cli.demo import demo_app, end_demo

STALLED = ("stalled-idle", "stalled-spinning")


def judged(v: dict, since_at_most: float) -> None:
    assert v["name"] in STALLED, v
    assert v["detail"] == "launch stopped at 'capturing draft cuda graphs'", v
    assert v["since"] is not None
    since = __import__("datetime").datetime.fromisoformat(v["since"]).timestamp()
    assert since <= since_at_most, (v["since"], since_at_most)
    assert any("log silent since" in e for e in v["evidence"]), v


async def test_every_first_look_at_a_demo_stalled_for_a_minute_says_stalled(demo_env, tmp_path):
    args, layout, pgids = demo_env
    path = layout.path
    app, layout, state = demo_app(args, layout)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.cockpit.monitor.following is not None, 30)
        monitor = app.cockpit.monitor
        pgids.append(monitor.following["pgid"])
        await until(pilot, lambda: monitor.verdict.name in STALLED, 60)
        log = Path(monitor.following["log"])
        # a minute of silence, on the log's own clock
        await until(pilot, lambda: time.time() - log.stat().st_mtime >= 60, 90, step=0.5)
        silent_since = log.stat().st_mtime + 1.0
        looks = {}
        for name, extra in (("default", []), ("instant", ["--wait", "0"]), ("wait 3", ["--wait", "3"])):
            res = run_cli("snapshot", "demo", "--layout", str(path), "--json", "--no-forensics", *extra, timeout=120)
            assert res.returncode == 0, res.stderr
            looks[name] = json.loads(res.stdout)
        for name, doc in looks.items():
            assert doc["verdict"]["name"] in STALLED, (
                name,
                doc["verdict"],
                doc["phase"],
                len(doc["processes"]),
                doc["log"]["path"],
                doc["agent"]["warnings"],
            )
            judged(doc["verdict"], silent_since)
        assert looks["default"]["looked_s"] < 10  # history decides at once: no stall window waited out
        text = run_cli(
            "snapshot", "demo", "--layout", str(path), "--text", "-", "--size", "100x30", "--no-forensics", timeout=120
        )
        assert text.returncode == 0 and "verdict stalled-idle" in text.stdout.splitlines()[0], text.stdout[:300]
        svg = tmp_path / "late.svg"
        res = run_cli("snapshot", "demo", "--layout", str(path), "--svg", str(svg), "--no-forensics", timeout=120)
        assert res.returncode == 0 and "stalled-idle" in svg.read_text()
        fleet = run_cli("snapshot", "--hosts", "demo", "--layout", str(path), "--json", timeout=120)
        assert fleet.returncode == 0, fleet.stderr
        judged(json.loads(fleet.stdout)["hosts"][0]["verdict"], silent_since)
        res = run_cli("bundle", "demo", "--layout", str(path), "--read-only", "--json", timeout=180)
        assert res.returncode == 0, res.stderr
        with tarfile.open(json.loads(res.stdout)["path"]) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("verdict.json"))
            judged(json.load(tar.extractfile(member))["verdict"], silent_since)
        res = run_cli("explain", str(log), "--json", timeout=60)
        doc = json.loads(res.stdout)
        assert res.returncode == 0 and doc["verdict"]["name"] == "stalled" and doc["verdict"]["cause"] == "silent"
        assert doc["phase"] == "capturing draft cuda graphs" and doc["silent_s"] >= 60 and doc["window_s"] == 3
        await pilot.press("q")
    await end_demo(args, app, layout, state)
