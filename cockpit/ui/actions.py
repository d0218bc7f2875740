"""The cockpit's action workflows: plan, confirm in a dialog that names what will be touched,
carry out through the agent, report. Each runs as a worker of the screen, one at a time; a
failure is a notification, never a crash of the screen."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

from rich.text import Text
from textual.screen import Screen

from cockpit.actions.dumps import PyspyMissing
from cockpit.actions.kill import (
    describe_clean,
    describe_kill,
    describe_shm,
    summarize_clean,
)
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import as_text, count
from cockpit.operate import bundle, perform
from cockpit.operate.acts import ACT, BUILT_IN
from cockpit.operate.bisect import bisect, configurations, describe_bisect
from cockpit.operate.relaunch import ablate, describe_ablation, describe_launch, run_variant
from cockpit.read import flightrec
from cockpit.runs.bisect import DEFAULT_SETTLE_S, FAILING, make_plan
from cockpit.runs.ledger import describe_ledger, read_bisects, read_ledger
from cockpit.runs.spec import RunSpec, default_spec
from cockpit.ui.fmt import say
from cockpit.ui.screens import BisectScreen, ConfirmScreen, RelaunchScreen, ReportScreen

TOAST_S = 5
UPLOADS: dict[str, bool] = {}  # the operator's answer to the py-spy upload, per host, while this cockpit runs


class ActionRunner:
    """The screen's actions on its host's run; `busy` names the one in flight, `outcome` is the
    last one's result (the header keeps it: a notification is short and may come while a dialog
    hides it)."""

    def __init__(self, screen: Screen):
        self.screen = screen
        self.busy: str | None = None
        self.progress = ""
        self.spec: RunSpec | None = None
        self.outcome: Text | None = None
        self.report: tuple[str, list[str]] | None = None  # the last action's full report (`v`)
        self.stop_bisect = False  # the operator asked the bisect under way to stop
        self.found_lines: list[str] = []  # what the act under way found before it acted (its report's head)

    @property
    def monitor(self):
        return self.screen.monitor

    @property
    def layout(self):
        return self.screen.profile

    def notify(self, message: str, **kw) -> None:
        """A notification; what it says may come from the host: shown as text, never markup."""
        kw.setdefault("timeout", TOAST_S)
        say(self.screen, message, **kw)

    def done(self, what: str, result: str, good: bool = True, report: list[str] | None = None) -> None:
        """An action's result in one line, kept in the header until the next one; its full report
        stays a key away (`v`)."""
        stamp = time.strftime("%H:%M:%S")
        self.outcome = as_text(f"{stamp} {what}: ", "bold") + as_text(result, "green" if good else "bold red")
        if report is not None:
            self.report = (f"{stamp} {what}: {result}", report)
            self.screen.refresh_bindings()
        self.screen.dirty = True

    def show_report(self) -> None:
        if self.report is not None:
            self.screen.app.push_screen(ReportScreen(*self.report))

    async def ask(self, screen):
        return await self.screen.app.push_screen_wait(screen)

    # the screen as an act's Asker (cockpit/operate/perform.py)

    async def confirm(self, title: str, lines: list[str], question: str) -> bool:
        return bool(await self.ask(ConfirmScreen(title, lines, question)))

    def found(self, lines: list[str]) -> None:
        """Kept for the act's report, not a notification each."""
        self.found_lines = list(lines)

    def tell(self, line: str) -> None:
        self.notify(line)

    def under_way(self, text: str) -> None:
        self.progress = text

    async def pyspy(self, then: str) -> bool:
        """py-spy made sure of here, asking the operator (`ensure_pyspy`): nothing left to send."""
        await self.ensure_pyspy(then)
        return False

    @asynccontextmanager
    async def exclusive(self, name: str):
        """One action at a time; its failure is a notification, never a crash of the screen."""
        if self.busy:
            self.notify(f"{self.busy} is still running", severity="warning")
            yield False
            return
        self.busy = name
        self.progress = ""  # not the last action's
        self.found_lines = []
        try:
            yield True
        except perform.NothingToAct as exc:
            self.notify(str(exc), severity="warning")
        except CockpitError as exc:
            self.done(name, f"failed: {exc}", good=False, report=[f"{name} failed:", str(exc)])
            self.notify(f"{name} failed: v shows why", severity="error")
        finally:
            self.busy = None
            self.screen.dirty = True

    def _progress(self, phase, verdict) -> None:
        self.progress = f"{phase or ''} {verdict}".strip()

    async def ensure_pyspy(self, then: str) -> None:
        """py-spy on the host before `then` needs it: the layout's interpreter's own, the host's
        PATH, an earlier upload; where there is none, this cockpit's offered (what is copied where),
        asked once per host while this cockpit runs. PyspyMissing when none is there in the end."""
        label = self.monitor.target.label
        path, check = await self.monitor.pyspy_check()
        if path:
            return
        refusal = self.monitor.pyspy_missing(check)
        offer = refusal.offer
        if offer is None or UPLOADS.get(label) is False:
            raise refusal
        if label not in UPLOADS:
            lines = [
                f"looked for: {'; '.join(check.get('looked') or [])}",
                f"copied: {offer['path']} (py-spy {offer['version']}, {offer['size']} bytes, sha256 {offer['sha256']})",
                f"to: {label}:{offer['dest']} (mode 700), where every later dump, bundle and stall's "
                f"forensics on {label} finds it",
                f"asked once for {label} while this cockpit runs",
            ]
            UPLOADS[label] = await self.ask(
                ConfirmScreen(f"py-spy is not on {label}", lines, f"Upload py-spy, then {then}?")
            )
            if not UPLOADS[label]:
                raise refusal
        self.progress = f"uploading py-spy to {label}:{offer['dest']}"
        await self.monitor.pyspy_check(upload=True, say=self.notify)

    # ------------------------------------------------------------------ workflows

    async def act(self, name: str) -> None:
        """The act `name` (cockpit/operate/acts.py): this runner's own workflow of that name (its
        dialogs), else the act's generic one (cockpit/operate/perform.py), its Outcome reported."""
        if name not in perform.WORKFLOWS:
            if name not in BUILT_IN:
                self.notify(f"the act {name!r} has no workflow (cockpit/operate/perform.py)", severity="error")
                return
            await getattr(self, name)()
            return
        act = ACT[name]
        async with self.exclusive(act.label.lower()) as go:
            if not go:
                return
            outcome = await perform.WORKFLOWS[name](self.monitor, self)
            if outcome is None:
                return
            self.done(act.label.lower(), outcome.summary, good=outcome.ok, report=outcome.lines)
            await self.ask(ReportScreen(f"{act.label.lower()}: {outcome.summary}", outcome.lines))

    async def kill_run(self) -> None:
        await self.kill(None, "kill the run")

    async def kill_one(self) -> None:
        """`k`: the process selected in the rank tree, and what it started."""
        pid = self.screen.ranks.selected_pid()
        procs = self.screen.state.procs
        if pid is None or not procs.get(pid) or not procs[pid].alive:
            self.notify("select a live process in the rank tree first", severity="warning")
            return
        await self.kill(pid, f"kill pid {pid}")

    async def kill(self, pid: int | None, what: str) -> None:
        """`K`: the run, which then reads no run; `k`: process `pid` (and what it started)."""
        async with self.exclusive(what) as go:
            if not go:
                return
            report = await perform.stop(self.monitor, self, what, f"{what}: asked by the operator", pid)
            if report is None:
                return
            lines = describe_kill(report)
            self.done(what, report["summary"], good=report["verified"], report=lines)
            await self.ask(ReportScreen(f"{what}: {report['summary']}", lines))

    async def shm(self) -> None:
        async with self.exclusive("shm audit") as go:
            if not go:
                return
            audit = await self.monitor.shm_audit()
            removable = [e for e in audit["entries"] if e["removable"]]
            keys = {"c": f"clean {len(removable)} removable"} if removable else {}
            none = (
                {}
                if removable
                else {
                    "c": f"nothing to remove: no entry of {audit['folder']} is safe to remove "
                    f"(the list says why each is kept)"
                }
            )
            choice = await self.ask(
                ReportScreen(
                    f"{audit['folder']} on {self.screen.state.agent.hostname}",
                    describe_shm(audit, others=False),
                    keys,
                    none,
                )
            )
            if choice != "c":
                return
            done = await perform.clean_shm(self.monitor, audit, self)
            if done is None:
                return
            lines = describe_clean(done)
            self.done("shm clean", summarize_clean(done), report=lines)
            await self.ask(ReportScreen(f"shm clean: {summarize_clean(done)}", lines))

    async def dump(self) -> None:
        async with self.exclusive("stack dump") as go:
            if not go:
                return
            plan, result = await perform.dump(self.monitor, self)
            ranks = plan.ranks
            groups = len(result.groups)
            odd = next((g for g in result.groups if g.odd), None)
            self.done(
                "stack dump",
                f"{count(len(ranks), 'rank')}, {count(groups, 'distinct stack')}"
                + (f", odd one out: rank {','.join(map(str, odd.ranks))}" if odd else "")
                + f", {result.folder}",
                report=self.found_lines + result.report() + [f"raw dumps: {result.folder}"],
            )
            title = f"stacks of {count(len(ranks), 'rank')}"
            keys = {"n": "native frames"} if result.groups else {}
            tail = [f"raw dumps: {result.folder}"]
            choice = await self.ask(ReportScreen(title, self.found_lines + result.report() + tail, keys))
            if choice == "n":
                await self.ask(ReportScreen(f"{title}, every frame", result.report(full=True) + tail))

    def _launch_dialog(self, **kw) -> RelaunchScreen:
        return RelaunchScreen(
            self.layout, self._current_spec(), self.monitor.launch_python(), self.monitor.sim_flags(), **kw
        )

    def _current_spec(self) -> RunSpec:
        if self.spec is None:
            self.spec = default_spec(self.layout)
        return self.spec

    async def relaunch(self) -> None:
        async with self.exclusive("relaunch") as go:
            if not go:
                return
            spec = await self.ask(self._launch_dialog())
            if spec is None:
                return
            agreed = await perform.agree_launch(self.monitor, self, spec)
            if agreed is None:
                return
            self.spec = spec
            sets = ",".join(spec.enabled) or "no flag sets"
            self.progress = f"stopping the current run, then launching with {sets}"
            row = await run_variant(
                self.monitor, spec, timeout=24 * 3600.0, progress=self._progress, plan=agreed.plan, shm=agreed.shm
            )
            good = row["outcome"] == "ready"
            report = agreed.lines + describe_launch(row)
            self.done(
                f"relaunch with {sets}",
                f"{row['summary']}; {row['run_id']} {row['outcome']}"
                + (f": {row['evidence'][0]}" if row["evidence"] else ""),
                good=good,
                report=report,
            )
            self.notify(f"{row['run_id']}: {row['outcome']}", severity="information" if good else "error")

    async def ablate(self) -> None:
        async with self.exclusive("ablation") as go:
            if not go:
                return
            choice = await self.ask(
                self._launch_dialog(
                    title="ablate: the chosen flag sets are switched on and off", note=RelaunchScreen.ABLATE
                )
            )
            if choice is None or not choice.enabled:
                return
            vary = choice.enabled
            agreed = await perform.agree_ablation(self.monitor, self, vary)
            if agreed is None:
                return
            rows = await ablate(
                self.monitor,
                vary,
                timeout=self.layout.stall.idle_s * 10 + 600,
                progress=self._progress,
                first_plan=agreed.plan,
                first_shm=agreed.shm,
            )
            table = describe_ablation(rows, vary)
            self.done(
                "ablation",
                ", ".join(f"{','.join(r['flag_sets']) or 'none'} {r['outcome']}" for r in rows),
                report=table,
            )
            await self.ask(ReportScreen("ablation", table))

    async def bisect(self) -> None:
        """`B`: the failing and the good configuration (the ledger's and the run on screen's, else
        the operator's choice), the plan (the suspects, how many launches at most), then the
        launches with the odds as they move in the header, then the answer with its odds. `B`
        again while it runs stops it cleanly: the current launch is stopped and verified gone, the
        ledger keeps what was learnt."""
        if self.busy == "bisect":
            if not self.stop_bisect and await self.ask(
                ConfirmScreen(
                    "stop the bisection",
                    [
                        "the current launch is stopped and verified gone; every outcome so far "
                        "stays in the ledger, and the same bisect started again resumes there"
                    ],
                    "Stop the bisection?",
                )
            ):
                self.stop_bisect = True
                self.screen.dirty = True
            return
        async with self.exclusive("bisect") as go:
            if not go:
                return
            sides = await self._bisect_sides()
            if sides is None:
                return
            plan = make_plan(
                self.layout, self.monitor.target.label, failing=sides[0], good=sides[1], settle=DEFAULT_SETTLE_S
            )
            agreed = await perform.agree_bisect(self.monitor, self, plan)
            if agreed is None:
                return
            self.stop_bisect = False
            step = [""]

            def on_step(n: int, most: int, text: str, odds: str) -> None:
                step[0] = f"launch {n} of at most {most}, {text}" + (f" (odds: {odds})" if odds else "")

            def progress(phase, verdict) -> None:
                self._progress(phase, verdict)
                stopping = "stopping (B asked), " if self.stop_bisect else ""
                self.progress = f"{stopping}{step[0]}: {self.progress}" if step[0] else self.progress

            doc = await bisect(
                self.monitor,
                plan,
                timeout=self.layout.stall.idle_s * 10 + 600,
                progress=progress,
                first_plan=agreed.plan,
                first_shm=agreed.shm,
                interrupted=lambda: self.stop_bisect,
                on_step=on_step,
            )
            report = describe_bisect(doc)
            self.done(
                "bisect",
                report[0].split(": ", 1)[1] + f", {count(doc['launches'], 'launch', 'launches')}",
                good=doc["status"] == "found",
                report=report,
            )
            await self.ask(ReportScreen("bisect", report))

    async def _bisect_sides(self) -> tuple[list[str], list[str]] | None:
        """The failing and the good configuration: those the ledger and the run on screen name
        (cockpit/operate/bisect.py, `configurations`), else the operator's choice of them."""
        record = self.monitor.run.record if self.monitor.run is not None else None
        current = (
            list(record["flag_sets"])
            if record and record.get("flag_sets") is not None
            else self._current_spec().enabled
        )
        verdict, phase = self.monitor.verdict, self.monitor.phase
        health = (
            "failing"
            if verdict.name.value in FAILING
            else "good"
            if phase.name in ("ready", "serving") and verdict.name.value == "ok"
            else "unknown"
        )
        failing, good = configurations(read_ledger(self.layout), current, health)
        if failing is not None and good is not None and set(failing) != set(good):
            return failing, good
        why = (
            "no failing run in the ledger of " + self.layout.name + ": choose the failing configuration"
            if failing is None
            else "no run of " + self.layout.name + " came up yet: choose the good configuration"
            if good is None
            else "the failing and the good run had the same flag sets: choose the suspects"
        )
        return await self.ask(
            BisectScreen(
                self.layout,
                failing if failing is not None else current,
                good if good is not None and good != failing else [],
                why,
            )
        )

    async def bundle(self) -> None:
        async with self.exclusive("hang bundle") as go:
            if go:
                if not self.screen.read_only:
                    try:
                        await self.ensure_pyspy("collect the bundle")
                    except PyspyMissing:
                        pass  # the bundle's manifest says the stacks are missing, and why
                self.notify("collecting the hang bundle (stacks, RAS, flight recorder, metrics, ...)")
                result = await bundle.make_bundle(self.monitor, read_only=self.screen.read_only)
                lines = bundle.describe(result)
                self.done("hang bundle", lines[0], report=lines)
                await self.ask(ReportScreen("hang bundle", lines))

    async def flightrec(self) -> None:
        async with self.exclusive("flight recorder") as go:
            if go:
                answer, result = await self.monitor.flight_record()
                lines = flightrec.describe(answer, result)
                odd = result.get("odd_rank")
                self.done(
                    "flight recorder",
                    f"{count(len(answer.get('ranks') or {}), 'rank')} read"
                    + (f", rank {odd} never joined" if odd is not None else "")
                    + ("" if answer.get("armed") else ", not armed"),
                    good=bool(answer.get("armed")),
                    report=lines,
                )
                await self.ask(ReportScreen("flight recorder", lines))

    def ledger(self) -> None:
        self.screen.app.push_screen(
            ReportScreen(
                f"runs of {self.layout.name}",
                describe_ledger(read_ledger(self.layout), bisects=read_bisects(self.layout)),
            )
        )
