"""A session with one host: starts the agent over a link, feeds its frames into HostState and
matches command results to requests. Used by the snapshot command, the UI and the tests alike."""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cockpit.agent import EXIT_TOO_OLD, EXIT_UNTRUSTED, agent_argv, guarded
from cockpit.agent.protocol import ERROR, FATAL, HELLO, PROTOCOL, RESULT
from cockpit.common.errors import CockpitError, CommandError, LinkLost, PythonUnusable
from cockpit.host.state import HostState
from cockpit.link.base import AgentStream, FrameTooLong, Link
from cockpit.link.connect import make_link
from cockpit.link.target import Target, python_checked

HELLO_TIMEOUT_S = 20.0
SILENCE_FLOOR_S = 1.0  # at sub-second refresh, a busy host's scheduler jitter is not a dead link


@dataclass
class WatchList:
    """What the agent watches: from the layout, or the defaults for SGLang and vLLM."""

    patterns: list[str] | None = None
    pgids: list[int] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)

    @classmethod
    def for_layout(cls, layout) -> WatchList:
        """The layout's process patterns, log and ports; the SGLang/vLLM defaults without one."""
        if layout is None:
            return cls()
        return cls(patterns=layout.watch, logs=[layout.log] if layout.log else [], ports=list(layout.ports))

    def args(self) -> dict:
        out = {"pgids": self.pgids, "pids": self.pids, "logs": self.logs, "ports": self.ports}
        if self.patterns is not None:
            out["patterns"] = self.patterns
        return out


# Tried in order when no interpreter is named and python3 cannot run the agent (missing, too old).
PYTHON_CANDIDATES = (
    "python3",
    "python3.13",
    "python3.12",
    "python3.11",
    "python3.10",
    "python3.9",
    "python3.8",
    "/usr/libexec/platform-python",
    "python",
)


@dataclass
class SessionOptions:
    python: str = "python3"
    python_named: bool = False  # --python or the layout's python: used as given, never another
    interval: float = 1.0
    sim_state: str | None = None  # the simulated NVML's state folder on the host
    ssh_config: str | None = None
    known_hosts: str | None = None
    accept_new: bool = False
    trust_python: bool = False  # --trust-python or the layout's trust_python: no GUARD check as root


FRAME_CONTAINERS_MAX = 1_000_000  # objects and arrays in one frame: ~100 MB decoded at most
FRAME_VALUES_MAX = 4_000_000  # values (and keys) in one frame: ~250 MB of short strings at most


class FrameTooCostly(Exception):
    """A frame whose decoding would cost far more memory than its bytes (`[{},{},…]`: 64 MiB of
    it is 1.7 GB of dicts; `["a","a",…]`: 64 MiB of it is a gigabyte of strings): skipped and
    said, never decoded."""


def _no_constant(_name: str) -> None:
    return None  # NaN, Infinity, -Infinity from a host: no number, null


def _finite_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None  # 1e999


def decode_frame(line: bytes) -> dict | None:
    """One frame, or None for a line that is not a frame of this protocol; non-finite numbers
    become null. FrameTooCostly for a frame with more than FRAME_CONTAINERS_MAX objects and
    arrays or FRAME_VALUES_MAX values (counted before decoding, so the cost is bounded by the
    count, not the content)."""
    if len(line) > FRAME_CONTAINERS_MAX and line.count(b"{") + line.count(b"[") > FRAME_CONTAINERS_MAX:
        raise FrameTooCostly(
            f"a frame of {len(line):,} bytes with more than {FRAME_CONTAINERS_MAX:,} objects and "
            f"arrays was skipped (decoding it would cost gigabytes)"
        )
    if len(line) > 2 * FRAME_VALUES_MAX:  # each value takes 2 bytes at least: a shorter frame holds fewer
        values = line.count(b",") + line.count(b":") + 1  # commas and colons inside strings count too: an upper bound
        if values > FRAME_VALUES_MAX:
            raise FrameTooCostly(
                f"a frame of {len(line):,} bytes with about {values:,} values (more than "
                f"{FRAME_VALUES_MAX:,}) was skipped (decoding it would cost gigabytes)"
            )
    try:
        frame = json.loads(line, parse_constant=_no_constant, parse_float=_finite_float)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(frame, dict) or frame.get("v") != PROTOCOL or not isinstance(frame.get("t"), str):
        return None
    return frame


def reconnect_failure(exc: Exception) -> str:
    """Why a reconnection failed, in one line, for an error that is not the cockpit's own."""
    if isinstance(exc, OSError):
        name = errno.errorcode.get(exc.errno or 0)
        return f"cannot reconnect: {exc.strerror or exc}" + (f" ({name})" if name else "") + ", retrying"
    return f"cannot reconnect: {type(exc).__name__}: {exc}, retrying"


class HostSession:
    def __init__(
        self,
        target: Target,
        opts: SessionOptions | None = None,
        watch: WatchList | None = None,
        on_frame: Callable[[dict], None] | None = None,
        state: HostState | None = None,
    ):
        self.target = target
        self.opts = opts or SessionOptions()
        self.watch = watch or WatchList()
        self.state = state or HostState(target.label)
        self.on_frame = on_frame
        self.link: Link | None = None
        self.stream: AgentStream | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None
        self._silence: asyncio.Task | None = None
        self.last_frame_at = time.monotonic()
        self.lost_reason: str | None = None
        self.link_error: str | None = None  # why the last reconnect failed, while it is down
        self.reconnects = 0
        self.ever_up = False
        self.errors: list[str] = []
        self.first_sample = asyncio.Event()
        self.sampled = asyncio.Event()  # set (and replaced) on each sample and when the link drops
        self._config_ids: set[int] = set()  # watch changes sent, not yet answered
        self._configuring: set[asyncio.Task] = set()  # their answers, awaited in the background
        self.samples = 0  # samples read on this session, across reconnects
        self.watch_seq = 0  # `samples` when the agent answered the last watch change
        self.closed = asyncio.Event()

    @property
    def trust_warnings(self) -> list[str]:
        """What the link could not check (host keys off by the ssh config): the screen shows it."""
        return list(getattr(self.link, "warnings", None) or [])

    # ------------------------------------------------------------------ lifecycle

    async def connect(self) -> None:
        self.link = make_link(self.target, self.opts)
        await self.link.connect()
        try:
            configured, hello = await self._start_agent(self.opts.python)
        except PythonUnusable as exc:
            if self.opts.python_named or self.opts.python != "python3":
                raise CockpitError(str(exc)) from None
            python = await self._other_python(exc.reason)
            configured, hello = await self._start_agent(python)
            self.opts.python = python  # a reconnect starts with the one that worked
            hello.setdefault("warnings", []).insert(
                0,
                f"python3 cannot run the agent here ({exc.reason}): using "
                f"{python}; name one with --python or python: in the layout",
            )
        self.state.apply(hello)
        self.state.agent.warnings[:0] = self.trust_warnings  # e.g. host keys not checked: said first
        self.state.link_state = "up"
        self.ever_up = True
        self.last_frame_at = time.monotonic()
        self.lost_reason = None
        self._reader = asyncio.create_task(self._read_loop())
        await self._answer("config", configured, 30.0)

    async def _start_agent(self, python: str) -> tuple[tuple[int, asyncio.Future], dict]:
        """The agent started with `python`: the config command sent (queued behind the source, so
        the first sample uses it) and the hello. PythonUnusable when that interpreter cannot run it."""
        argv, payload = agent_argv(
            python, self.opts.interval, self.opts.sim_state, python_checked(self.target, python, self.opts.trust_python)
        )
        self.stream = await self.link.start_agent(argv, payload)
        configured = self._send("config", self.watch.args())
        try:
            return configured, await self._read_hello()
        except PythonUnusable:
            self._pending.pop(configured[0], None)
            self._config_ids.discard(configured[0])
            await self.stream.aclose()  # its process has ended: only the channel is left
            raise

    async def _other_python(self, why: str) -> str:
        """The first of PYTHON_CANDIDATES after python3 that runs and is >= 3.8, asked one by one
        (argv, no shell); else a CockpitError naming each one tried and how to name another."""
        tried = [f"python3 ({why})"]
        probe = "import sys;print('%d.%d'%sys.version_info[:2])"
        for python in PYTHON_CANDIDATES[1:]:
            argv = [python, "-I", "-c", probe]
            try:
                res = await self.link.run(
                    guarded(argv) if python_checked(self.target, python, self.opts.trust_python) else argv, timeout=10.0
                )
            except FileNotFoundError:
                tried.append(f"{python} (not found)")
                continue
            except (OSError, CockpitError) as exc:
                tried.append(f"{python} ({exc})")
                continue
            version = res.stdout.decode(errors="replace").strip()
            if res.rc == 0 and tuple(int(x) for x in version.split(".") if x.isdigit()) >= (3, 8):
                return python
            if res.rc == EXIT_UNTRUSTED:
                tried.append(f"{python} (refused: {res.stderr.decode(errors='replace').strip().partition('; ')[0]})")
                continue
            tried.append(
                f"{python} ("
                + (f"Python {version}" if res.rc == 0 else "not found" if res.rc in (None, 127) else f"exit {res.rc}")
                + ")"
            )
        raise CockpitError(
            f"{self.target.label}: no Python >= 3.8 to run the agent; tried {', '.join(tried)}. "
            f"Name one with --python PATH (or python: in the layout)"
        )

    async def _read_hello(self) -> dict:
        where = self.target.label
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CockpitError(
                    f"the agent on {where} sent nothing in {HELLO_TIMEOUT_S:.0f} s: is the host overloaded?"
                )
            try:
                line = await asyncio.wait_for(self.stream.readline(), left)
            except asyncio.TimeoutError:
                continue
            except FrameTooLong as exc:
                self.errors.append(str(exc))
                continue
            if not line:
                raise await self._agent_failed()  # PythonUnusable when the interpreter is missing or old
            try:
                frame = decode_frame(line)
            except FrameTooCostly as exc:
                self.errors.append(str(exc))
                continue
            if frame is None:
                continue
            if frame["t"] == FATAL:
                raise CockpitError(f"{where}: {frame.get('msg')}")
            if frame["t"] == HELLO:
                return frame

    async def _agent_failed(self) -> CockpitError:
        """The agent's process ended before its hello: say why in one line."""
        rc = await asyncio.wait_for(self.stream.wait(), 5)
        err = await self.stream.stderr_tail()
        last = err.splitlines()[-1] if err else ""
        py = self.opts.python
        if rc == EXIT_UNTRUSTED:  # never another interpreter instead: the operator decides
            return CockpitError(f"{self.target.label}: {last.removeprefix('gpu-cockpit: ')}")
        if rc == 127 or "No such file" in err or "not found" in err:
            return PythonUnusable(
                f"{py} not found on {self.target.label}: install Python >= 3.8 there or name the "
                f"interpreter with --python (or python: in the layout)",
                "not found",
            )
        if rc == EXIT_TOO_OLD:
            why = last.removeprefix("gpu-cockpit: ")
            return PythonUnusable(f"{self.target.label}: {why}; name a newer one with --python", why)
        return CockpitError(f"the agent on {self.target.label} exited with status {rc}: {last or 'no message'}")

    async def _read_loop(self) -> None:
        try:
            while True:
                try:
                    line = await self.stream.readline()
                except FrameTooLong as exc:  # skipped whole and said, never cut into silent pieces
                    self.last_frame_at = time.monotonic()
                    self.errors.append(str(exc))
                    self.state.notes.append(str(exc))
                    continue
                if not line:
                    break
                self.last_frame_at = time.monotonic()
                try:
                    frame = decode_frame(line)
                except FrameTooCostly as exc:
                    self.errors.append(str(exc))
                    self.state.notes.append(str(exc))
                    self.state.dropped["frames too costly to decode"] += 1
                    continue
                if frame is None:
                    continue
                kind = frame["t"]
                if kind == RESULT:
                    if frame.get("id") in self._config_ids:  # in force from the agent's next tick on
                        self._config_ids.discard(frame.get("id"))
                        self.watch_seq = self.samples
                    fut = self._pending.pop(frame.get("id"), None)
                    if fut is not None and not fut.done():
                        fut.set_result(frame)
                elif kind in (ERROR, FATAL):
                    self.errors.append(str(frame.get("msg")))
                else:
                    self.state.apply(frame)
                    if kind == "sample":
                        self.samples += 1
                        self.first_sample.set()
                        self._wake_samplers()
                if self.on_frame is not None:
                    self.on_frame(frame)
        finally:
            self.state.link_state = "lost"
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(LinkLost("the link dropped: the command's outcome is unknown"))
            self._pending.clear()
            self._config_ids.clear()  # a new agent is configured anew on reconnection
            self.closed.set()
            self._wake_samplers()

    def _wake_samplers(self) -> None:
        done, self.sampled = self.sampled, asyncio.Event()
        done.set()

    def watch_silence(self) -> None:
        """End this connection when it goes silent (see _watch_silence). Only for a link that is
        kept (reconnected after): called by keep(), and right after connecting by a caller that
        will keep it, so a host that hangs during the first requests is not waited on for 30 s."""
        if not self.closed.is_set() and (self._silence is None or self._silence.done()):
            self._silence = asyncio.create_task(self._watch_silence())

    async def _watch_silence(self) -> None:
        """A link that goes quiet without closing (a host that hung or rebooted, a pulled cable)
        would otherwise look alive until ssh keepalives give up, 30 s later. The agent sends a
        sample every interval, so two intervals without a byte end the link here. Time this
        event loop itself was stalled is not counted against the host. Only a kept link is
        watched: a one-shot command on a host too busy to answer for a while should wait, not
        fail with its outcome unknown."""
        last_check = time.monotonic()
        while not self.closed.is_set():
            step = self.opts.interval / 4
            await asyncio.sleep(step)
            now = time.monotonic()
            if now - last_check > max(step * 3, 0.5):
                self.last_frame_at = max(self.last_frame_at, now - step)
            last_check = now
            silent = now - self.last_frame_at
            if silent > max(2.0 * self.opts.interval, SILENCE_FLOOR_S) and self._reader is not None:
                self.lost_reason = f"no data for {silent:.1f} s"
                self._reader.cancel()
                return

    async def keep(self, retry_first: bool = False) -> None:
        """Keep the link up until cancelled: after a loss, reconnect with backoff (1, 2, 4 … 30 s),
        re-sending the agent and the same watch. A command in flight is never re-sent (its caller
        got LinkLost). With retry_first, a first connection that failed is retried the same way
        (a fleet's host that is down now may be up later). Any failure of a reconnection (this
        process out of file descriptors, say) is tried again the same way, never the end of it;
        link_error says why. state.link_state says where it stands."""
        if retry_first and self._reader is None:
            self.closed.set()
            self.lost_reason = self.link_error
        while True:
            self.watch_silence()
            await self.closed.wait()
            self.link_error = self.lost_reason
            attempt = 0
            while True:
                attempt += 1
                self.state.link_state = f"{'lost' if self.ever_up else 'down'}, retrying ({attempt})"
                await asyncio.sleep(min(30.0, 2.0 ** (attempt - 1)))
                try:
                    await self.reconnect()
                    break
                except CockpitError as exc:
                    self.link_error = str(exc)
                except Exception as exc:  # EMFILE starting the agent, a refused pipe: tried again, said
                    self.link_error = reconnect_failure(exc)
            self.link_error = None
            self.reconnects += 1

    async def reconnect(self) -> None:
        """After a lost link: a new connection and a new agent, the same watch and the same
        HostState (its history goes on; processes gone meanwhile show as gone)."""
        await self.close()
        self.stream, self._reader, self._silence, self.link = None, None, None, None
        self._pending = {}
        self.closed = asyncio.Event()
        await self.connect()

    async def close(self) -> None:
        if self._silence is not None:
            self._silence.cancel()
        if self.stream is not None:
            await self.stream.aclose()
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
        if self.link is not None:
            await self.link.close()

    # ------------------------------------------------------------------ commands

    async def request(self, cmd: str, timeout: float = 30.0, **args) -> dict:
        """Send one command and wait for its one answer."""
        if self.stream is None or self.closed.is_set():
            raise LinkLost("not connected")
        return await self._answer(cmd, self._send(cmd, args), timeout)

    def _send(self, cmd: str, args: dict) -> tuple[int, asyncio.Future]:
        cid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[cid] = fut
        if cmd == "config":
            self._config_ids.add(cid)
        self.stream.write((json.dumps({"id": cid, "cmd": cmd, "args": args}) + "\n").encode())
        return cid, fut

    async def _answer(self, cmd: str, sent: tuple[int, asyncio.Future], timeout: float) -> dict:
        cid, fut = sent
        try:
            frame = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            self._pending.pop(cid, None)
            self._config_ids.discard(cid)
            raise CommandError(f"{cmd}: no answer from the agent in {timeout:.0f} s") from None
        if not frame.get("ok"):
            raise CommandError(f"{cmd}: {frame.get('error')}")
        return frame.get("data") or {}

    def watch_run(self, pgid: int | None, log: str | None, pids: list[int] | None = None) -> None:
        """Watch this process group alone, or (`pids`) these processes' trees alone (a server
        started elsewhere: the tree that holds the layout's port), None and no pids: nothing until
        a run is followed; and follow this log from now on: title patterns would find every server
        on the host, and a colleague's rank that ends is no crash of ours. The agent is told at
        once; `watch_changing` holds until it answers, and the sample after shows the new watch.
        Whose run it is is the monitor's business (Monitor.follow): the session knows processes
        and files, not runs."""
        self.watch.patterns = []
        self.watch.pgids = [pgid] if pgid is not None else []
        self.watch.pids = [int(p) for p in pids or ()]
        if log:
            self._only_log(log)  # the screen follows the new run's log from its first line
        if self.stream is None or self.closed.is_set():
            return  # sent with the next connection's config
        task = asyncio.get_running_loop().create_task(
            self._answer("config", self._send("config", self.watch.args()), 30.0)
        )
        self._configuring.add(task)
        task.add_done_callback(self._configured)

    def _configured(self, task: asyncio.Task) -> None:
        self._configuring.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(f"watch change: {task.exception()}")

    @property
    def watch_changing(self) -> bool:
        """A watch change is sent and not answered yet: samples until then show the old one."""
        return bool(self._config_ids)

    async def follow_log(self, path: str) -> None:
        """Follow this log (from its recent tail) instead of the ones followed now (their lines
        leave the screen: the log shown and judged is this one)."""
        self._only_log(path)
        await self.request("config", **self.watch.args())

    async def follow_logs(self, paths: list[str]) -> None:
        """Follow these logs (each server's own, when every server on the host is a run of its
        own); the others leave the state."""
        self.watch.logs = list(paths)
        for old in [p for p in self.state.logs if p not in paths]:
            del self.state.logs[old]
        await self.request("config", **self.watch.args())

    def _only_log(self, path: str) -> None:
        """This log is the one watched: the others' lines leave the state."""
        self.watch.logs = [path]
        for old in [p for p in self.state.logs if p != path]:
            del self.state.logs[old]

    async def ping(self) -> float:
        start = time.monotonic()
        await self.request("ping", timeout=10)
        self.state.rtt_ms = (time.monotonic() - start) * 1000.0
        return self.state.rtt_ms

    def watch_current(self) -> bool:
        """Whether what is watched now (processes, logs) is what the samples show: every watch
        change answered, and a sample since (the agent's tick reads the logs first, so that
        sample comes after the new log's lines). A first look is not decided before."""
        return not self._config_ids and self.samples > self.watch_seq

    async def wait_samples(self, n: int = 1, timeout: float = 30.0) -> None:
        """Wait until n samples have arrived since now: woken by each one, not polling for it."""
        start = self.state.seq
        deadline = time.monotonic() + timeout
        while self.state.seq < start + n:
            if self.closed.is_set():
                raise LinkLost(f"the link to {self.target.label} dropped")
            left = deadline - time.monotonic()
            if left <= 0:
                raise CockpitError(f"no sample from {self.target.label} in {timeout:.0f} s")
            try:
                await asyncio.wait_for(self.sampled.wait(), left)
            except asyncio.TimeoutError:
                pass
