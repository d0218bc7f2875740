"""One table of acts drives the screen and the CLI: the screen's bindings and allowed-check and
the CLI's act commands are the table's rows, and a toy act plugs in by one row and one workflow
(tests/data/acts/toy.py), with nothing written for it in cockpit/ui/ or cockpit/cli/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cockpit.cli import COMMANDS
from cockpit.operate.acts import ACTS
from cockpit.ui.cockpit import CockpitScreen

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "data" / "acts" / "toy.py"


def test_the_screens_keys_and_the_clis_commands_are_the_tables():
    bound = {b.action: b.key for b in CockpitScreen.BINDINGS}
    assert all(bound[a.name] == a.key for a in ACTS)
    assert all(COMMANDS[a.command] == (a.family, a.summary) for a in ACTS)
    assert all(callable(getattr(CockpitScreen, f"action_{a.name}")) for a in ACTS)


def _python(code: str, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter, as a plug-in is loaded before the screen and the CLI."""
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _toy_run(code: str, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """`code` after the toy act was loaded."""
    prelude = (
        f"import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('toy_act', {str(TOY)!r})\n"
        f"spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
    )
    return _python(prelude + code, tmp_path, *argv)


def test_a_toy_act_is_a_command_of_the_cli(tmp_path):
    done = _toy_run("from cockpit.cli import main\nsys.exit(main(['--help']))", tmp_path)
    assert done.returncode == 0 and "the live run's package versions" in done.stdout, done.stderr
    done = _toy_run("from cockpit.cli import main\nsys.exit(main(['versions', 'local', '--yes', '--json']))", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ask local for the run's versions" in done.stderr and "asked local" in done.stderr  # the plan, then told
    assert isinstance(json.loads(done.stdout)["versions"], dict)
    done = _toy_run("from cockpit.cli import main\nsys.exit(main(['versions', 'local', '--read-only']))", tmp_path)
    assert done.returncode == 2 and "refused, --read-only" in done.stderr and not done.stdout


TOY_SCREEN = r"""
import asyncio, json
from pathlib import Path
from cockpit.host.snapshot import state_from_doc
from cockpit.ui.app import CockpitApp
from cockpit.ui.cockpit import CockpitScreen
from cockpit.ui.screens import ConfirmScreen

assert any(b.key == "V" and b.action == "versions" for b in CockpitScreen.BINDINGS)
doc = json.loads(Path(sys.argv[1]).read_text())

async def main():
    app = CockpitApp(state=state_from_doc(doc))
    async with app.run_test() as pilot:
        await pilot.pause()
        assert app.cockpit.check_action("versions", ()) is False  # the table: no live link, not offered
        app.cockpit.action_versions()
        asked = False
        for _ in range(200):
            await pilot.pause(0.05)
            if isinstance(app.screen, ConfirmScreen) and not asked:
                print("asked:", " | ".join(app.screen.lines))
                asked = True
                await pilot.press("y")
            if app.cockpit.actions.report is not None:
                break
        title, lines = app.cockpit.actions.report
        print(title)
        print(chr(10).join(lines))

asyncio.run(main())
"""


def test_a_toy_act_is_a_key_of_the_screen(tmp_path):
    """Bound to its key, not offered without a live link (the table's rule), and carried out by the
    screen's generic runner when called: a recorded moment refuses it in words, in its report."""
    fixture = ROOT / "tests" / "fixtures" / "demo-serving.json"
    done = _toy_run(TOY_SCREEN, tmp_path, str(fixture))
    assert done.returncode == 0, done.stderr
    assert "asked: ask local for the run's versions" in done.stdout, done.stdout  # its plan, asked first
    assert "versions: failed" in done.stdout and "a replayed snapshot has no run to ask" in done.stdout, done.stdout


def test_a_plugged_act_that_would_clash_or_has_no_workflow_is_refused_in_words(tmp_path):
    """An act on a key of the screen's own (`v`, the report) is refused when the screen is built,
    naming both; one whose command would not be the act family's is refused at once; one that came
    without its workflow is a command that says so in one line (exit 2), never an internal error."""
    act = "acts.Act('{name}', '{key}', 'X', 'x', 'X: x', '{name}', '{family}', 'x', asks=False)"

    def run(code: str) -> subprocess.CompletedProcess:
        return _python("from cockpit.operate import acts\n" + code, tmp_path)

    done = run(f"acts.register({act.format(name='again', key='v', family='act')})\nimport cockpit.ui.cockpit")
    assert done.returncode == 1 and "act 'again': key 'v' or its name is the screen's 'report' already" in done.stderr
    done = run(f"acts.register({act.format(name='later', key='W', family='launch')})")
    assert done.returncode == 1 and "a registered act's command is the act family's" in done.stderr
    done = run(
        f"acts.register({act.format(name='bare', key='W', family='act')})\n"
        "import sys\nfrom cockpit.cli import main\nsys.exit(main(['bare', 'local']))"
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "cockpit: the act 'bare' has no workflow (cockpit/operate/perform.py): nothing to run"
    ], done.stderr
