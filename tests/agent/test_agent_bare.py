"""Nothing to install on the host: the agent's modules import only the standard library, travel as
one zip imported from memory, and run on a bare Python (a venv without pip or packages) with
processes, ports, CPU, memory and logs from /proc; NVML through ctypes when pynvml is absent;
another interpreter found, or the ones tried said, when python3 cannot run the agent."""

from __future__ import annotations

import ast
import asyncio
import json
import marshal
import os
import platform
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cannot_run

import cockpit.agent as shipped
from cockpit.agent import gpus, nvml
from cockpit.common.errors import CockpitError
from cockpit.host.session import HostSession, SessionOptions, WatchList
from cockpit.link.target import parse_target

AGENT = Path(shipped.__file__).parent
OPTIONAL = {"pynvml", "psutil"}  # imported inside functions only, and only when present


def _imports(tree):
    """(name, top level?) of every absolute import in a module."""
    top = set(id(n) for n in tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name.split(".")[0], id(node) in top
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module.split(".")[0], id(node) in top


@pytest.mark.parametrize("path", shipped.agent_modules(), ids=lambda p: p.name)
def test_every_module_that_travels_imports_only_the_standard_library_and_parses_as_python_3_8(path):
    tree = ast.parse(path.read_text(), feature_version=(3, 8))  # no match, no parenthesized with-items
    for name, top in _imports(tree):
        assert name in sys.stdlib_module_names or (name in OPTIONAL and not top), (path.name, name)
    for node in ast.walk(tree):
        assert not (isinstance(node, ast.Attribute) and node.attr in ("removeprefix", "removesuffix")), node.lineno
        assert not isinstance(node, ast.AnnAssign) and not getattr(node, "returns", None), node.lineno  # no X | Y


def test_the_payload_is_a_marshalled_table_of_the_agents_modules_that_the_bootstrap_imports_from_memory():
    """What travels to a host: every module's source (the operator side's __init__ stays here),
    in marshal's format 2 (read by every Python >= 3.8), no code objects (the host's Python may
    be another); the same bytes every time."""
    argv, payload = shipped.agent_argv("python3", 1.0, None)
    table = marshal.loads(payload)
    assert argv[1:5] == ["-I", "-S", "-u", "-c"] and argv[6] == str(len(payload)) and payload[:1] == b"{"
    assert table["python"] == "" and table["code"] == b""
    here = sorted(f.stem for f in Path(shipped.__file__).parent.glob("*.py") if f.name != "__init__.py")
    assert sorted(table["modules"]) == here and "memimport" in here and "nvml" in here
    assert table["modules"]["main"] == (Path(shipped.__file__).parent / "main.py").read_bytes()
    assert shipped.agent_source() == payload


def test_the_local_agent_gets_its_modules_compiled_for_this_python_and_a_host_of_another_compiles_them(monkeypatch):
    """The cockpit's own interpreter (the `local` target) gets the modules' code from Python's
    own cache (written there first where missing, as an import would), tagged with this
    sys.version: the agent runs it without compiling. An agent whose Python is another build
    (here: the table's version string altered) ignores the code and compiles the sources: both
    answer with a hello."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # the test machine's shell may turn it off
    shipped.agent_source.cache_clear()
    argv, payload = shipped.agent_argv(sys.executable, 1.0, None)
    shipped.agent_source.cache_clear()
    table = marshal.loads(payload)
    assert table["python"] == sys.version
    code = marshal.loads(table["code"])
    assert set(code) == set(table["modules"])  # every module had (or was given) its cache entry
    assert marshal.loads(code["main"]).co_filename.endswith("main.py")
    other = dict(table, python=sys.version + " (another build)")
    for sent in (payload, marshal.dumps(other, 2)):
        args = [sys.executable, "-I", "-u", "-c", shipped.BOOTSTRAP, str(len(sent)), "--interval", "1.0"]
        out = subprocess.run(args, input=sent, capture_output=True, timeout=60)
        hello = json.loads(out.stdout.splitlines()[0])
        assert hello["t"] == "hello" and hello["python"] == platform.python_version(), out.stderr[-500:]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A venv made without pip or packages: no psutil, no pynvml, nothing but the standard library."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python3"
    probe = "import importlib.util as u;print(u.find_spec('psutil'), u.find_spec('pynvml'))"
    assert subprocess.run([str(python), "-c", probe], capture_output=True, text=True).stdout.split() == ["None", "None"]
    return python


LISTENER = """
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
with open(sys.argv[1], "a") as log:
    log.write("listening on %d\\n" % s.getsockname()[1]); log.flush()
    end = time.time() + 60
    while time.time() < end:
        sum(range(20000))  # some CPU to measure
        time.sleep(0.01)
"""


def test_the_agent_on_a_bare_venv_reports_processes_ports_cpu_memory_and_a_log_and_writes_nothing(
    bare_python, tmp_path, monkeypatch
):
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir(), tmp.mkdir()
    log = tmp_path / "run.log"
    server = subprocess.Popen([sys.executable, "-c", LISTENER, str(log)])
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi either
    try:
        for _ in range(100):
            if log.exists() and log.read_text():
                break
            import time

            time.sleep(0.05)
        port = int(log.read_text().split()[-1])
        opts = SessionOptions(python=str(bare_python), python_named=True)
        watch = WatchList(pids=[server.pid], logs=[str(log)], ports=[port])

        async def look():
            session = HostSession(parse_target("local"), opts, watch)
            await session.connect()
            try:
                await session.wait_samples(3)
                return session.state
            finally:
                await session.close()

        state = asyncio.run(look())
    finally:
        server.kill()
        server.wait()
    a = state.agent
    assert (a.executable, a.procs_source, a.gpu_source, a.psutil) == (str(bare_python), "proc", "none", None)
    assert any(w.startswith("no NVIDIA driver on this host") for w in a.warnings)  # no libnvidia-ml.so.1 here
    proc = state.procs[server.pid]
    assert proc.cmdline[:2] == [sys.executable, "-c"] and proc.rss_mib > 1 and proc.cpu_pct > 0
    assert any(p.port == port and p.listening and p.pid == server.pid for p in state.ports)
    assert [line.text for line in state.logs[str(log)].lines] == [f"listening on {port}"]
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []  # imported from memory: nothing written


def test_the_ctypes_nvml_shim_has_nvml_h_layouts_and_fails_cleanly_without_the_library(monkeypatch):
    import ctypes

    assert nvml.nvmlMemory_v2 == 0x02000028 and ctypes.sizeof(nvml.c_nvmlMemory_v2_t) == 40
    assert ctypes.sizeof(nvml.c_nvmlProcessInfo_t) == 24 and ctypes.sizeof(nvml.c_nvmlUtilization_t) == 8
    # nvml.h: nvmlPciInfo_t is 16 + 5 * 4 + 32 bytes; nvmlEventData_t a pointer, two 64-bit words, two ints
    assert ctypes.sizeof(nvml.c_nvmlPciInfo_t) == 68 and nvml.c_nvmlPciInfo_t.busId.offset == 36
    assert ctypes.sizeof(nvml.c_nvmlEventData_t) == 32 and nvml.c_nvmlEventData_t.eventData.offset == 16
    assert nvml.c_nvmlEventData_t.gpuInstanceId.offset == 24
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("this machine has NVIDIA's driver: tests/gpu covers it")
    except OSError:
        pass
    with pytest.raises(nvml.NVMLError_LibraryNotFound) as err:
        nvml.nvmlInit()
    assert "libnvidia-ml.so.1" in str(err.value)
    with pytest.raises(nvml.NVMLError):
        nvml.nvmlDeviceGetCount()  # never loaded: uninitialised, not a crash
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml fails
    monkeypatch.setenv("PATH", "/nonexistent")
    warnings = []
    found = gpus.open_gpus(1.0, warnings)
    assert found.kind == "none" and found.static() == [] and found.sample(True) == []
    assert warnings[0].startswith("no NVIDIA driver on this host (NVML Shared Library Not Found")
    assert "trying nvidia-smi" in warnings[0] and "neither NVML nor nvidia-smi" in warnings[1]


FAKE_NVML = r"""
/* libnvidia-ml.so.1 as the driver exports it, for a machine without one: two GPUs, the functions
   the agent calls, ECC not supported, no ClocksEventReasons (a driver before 535). */
#include <string.h>
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem2_t;
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_t;
static int up;
int nvmlInit_v2(void) { up = 1; return 0; }
int nvmlShutdown(void) { up = 0; return 0; }
const char *nvmlErrorString(int r) { return r == 3 ? "Not Supported" : "Unknown Error"; }
int nvmlSystemGetDriverVersion(char *b, unsigned int n) { strncpy(b, "999.1.2", n); return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return up ? 0 : 1; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { *h = (void *)(long)(0x1000 + i); return i < 2 ? 0 : 2; }
static int idx(void *h) { return (int)((long)h - 0x1000); }
int nvmlDeviceGetName(void *h, char *b, unsigned int n) { strncpy(b, "NVIDIA H200", n); return 0; }
int nvmlDeviceGetUUID(void *h, char *b, unsigned int n) { strncpy(b, idx(h) ? "GPU-b" : "GPU-a", n); return 0; }
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) { u->gpu = 40 + idx(h); u->memory = 7; return 0; }
int nvmlDeviceGetMemoryInfo_v2(void *h, mem2_t *m) {
  if (m->version != 0x02000028) return 2;
  m->total = 150ULL << 30; m->reserved = 600ULL << 20; m->used = (idx(h) + 1) * (1000ULL << 20);
  m->free = m->total - m->used - m->reserved; return 0; }
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) { m->total = 150ULL << 30; m->used = 1; m->free = 0; return 0; }
int nvmlDeviceGetPowerUsage(void *h, unsigned int *p) { *p = 123456; return 0; }
int nvmlDeviceGetEnforcedPowerLimit(void *h, unsigned int *p) { *p = 700000; return 0; }
int nvmlDeviceGetTemperature(void *h, int s, unsigned int *t) { *t = s == 0 ? 51 : 0; return s == 0 ? 0 : 2; }
int nvmlDeviceGetClockInfo(void *h, int c, unsigned int *v) { *v = c == 1 ? 1980 : 0; return c == 1 ? 0 : 2; }
int nvmlDeviceGetCurrentClocksThrottleReasons(void *h, unsigned long long *r) { *r = 4; return 0; }
int nvmlDeviceGetTotalEccErrors(void *h, int t, int c, unsigned long long *n) { return 3; }
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *n, proc_t *p) {
  unsigned int want = idx(h) ? 3 : 0, i;
  if (*n < want) { *n = want; return 7; }
  for (i = 0; i < want; i++) { p[i].pid = 100 + i; p[i].used = i == 2 ? ~0ULL : (i + 1) * (256ULL << 20); }
  *n = want; return 0; }
/* the GPU's own word (issue 28): nvml.h's layouts, GPU 1 with a row remap pending and one Xid 79 */
#include <unistd.h>
typedef struct { char legacy[16]; unsigned int domain, bus, device, devid, subsys; char busId[32]; } pci_t;
typedef struct { void *device; unsigned long long type, data; unsigned int gi, ci; } event_t;
int nvmlDeviceGetIndex(void *h, unsigned int *i) { *i = idx(h); return 0; }
int nvmlDeviceGetPciInfo_v3(void *h, pci_t *p) {
  memset(p, 0, sizeof *p); p->bus = 0x3b + idx(h); strcpy(p->busId, idx(h) ? "00000000:3C:00.0" : "00000000:3B:00.0");
  return 0; }
int nvmlDeviceGetRemappedRows(void *h, unsigned int *c, unsigned int *u, unsigned int *p, unsigned int *f) {
  *c = 2; *u = idx(h); *p = idx(h); *f = 0; return 0; }
int nvmlDeviceGetRetiredPagesPendingStatus(void *h, unsigned int *p) { return 3; }
int nvmlDeviceGetNvLinkState(void *h, unsigned int l, unsigned int *on) { if (l >= 4) return 3; *on = l < 2; return 0; }
int nvmlDeviceGetNvLinkErrorCounter(void *h, unsigned int l, int c, unsigned long long *v) { *v = c == 0 ? 5 : 0; return 0; }
int nvmlDeviceGetPcieReplayCounter(void *h, unsigned int *v) { *v = 7; return 0; }
int nvmlDeviceGetSupportedEventTypes(void *h, unsigned long long *t) { *t = 0x1f; return 0; }
static int sent;
int nvmlEventSetCreate(void **s) { *s = (void *)0x5e7; return 0; }
int nvmlDeviceRegisterEvents(void *h, unsigned long long t, void *s) { return s == (void *)0x5e7 && (t & 8) ? 0 : 2; }
int nvmlEventSetWait_v2(void *s, event_t *e, unsigned int ms) {
  if (!sent) { sent = 1; e->device = (void *)0x1001; e->type = 8; e->data = 79; e->gi = e->ci = ~0U; return 0; }
  usleep(ms * 1000); return 10; }
int nvmlEventSetFree(void *s) { return 0; }
"""


@pytest.fixture(scope="module")
def fake_libnvml(tmp_path_factory):
    """A real shared library named libnvidia-ml.so.1, built here, that the dynamic loader finds."""
    if not (os.path.exists("/usr/bin/cc") or os.path.exists("/usr/bin/gcc")):
        cannot_run("no C compiler (apt-get install gcc)")
    where = tmp_path_factory.mktemp("libnvml")
    (where / "nvml.c").write_text(FAKE_NVML)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(where / "libnvidia-ml.so.1"), str(where / "nvml.c")], check=True
    )
    return where


@pytest.mark.parametrize("which", ["bare venv", "python 3.8"])
def test_the_agent_samples_gpus_through_ctypes_nvml_on_a_bare_venv_and_on_python_3_8(
    which, bare_python, fake_libnvml, monkeypatch
):
    python = bare_python if which == "bare venv" else _interpreter("3.8")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_libnvml))

    async def look():
        session = HostSession(parse_target("local"), SessionOptions(python=str(python), python_named=True))
        await session.connect()
        try:
            await session.wait_samples(2)
            for _ in range(50):  # the Xid comes from the event thread: within a sample or two
                if session.state.xid:
                    break
                await asyncio.sleep(0.1)
            facts = await session.request("host_facts", items=["versions"])
            return session.state, facts
        finally:
            await session.close()

    state, facts = asyncio.run(look())
    assert which == "bare venv" or state.agent.python.startswith("3.8.")
    assert (state.agent.gpu_source, state.agent.nvml, state.agent.driver) == ("nvml-ctypes", "nvml-ctypes", "999.1.2")
    g0, g1 = state.gpus[0], state.gpus[1]
    assert (g0.name, g0.uuid, g1.uuid, g0.mem_total_mib, g0.power_limit_w) == (
        "NVIDIA H200",
        "GPU-a",
        "GPU-b",
        153600,
        700.0,
    )
    assert (g1.util_pct, g1.mem_used_mib, g1.temp_c, g1.power_w, g1.sm_clock_mhz) == (41, 2000, 51, 123.5, 1980)
    assert g1.throttle == 4 and g1.ecc_uncorrected is None  # the pre-535 name; ECC not supported: absent
    assert sorted(tuple(p) for p in g1.processes) == [
        (100, 256),
        (101, 512),
        (102, None),
    ]  # no rights to its memory: None
    assert list(g0.processes) == []
    assert facts["versions"]["data"]["cuda_driver"] == "13.0"
    # the slow clock's health fields and the event set, through the same library
    assert (g1.remap_corrected, g1.remap_uncorrected, g1.remap_pending, g1.remap_failure) == (2, 1, True, False)
    assert (g0.remap_pending, g1.retired_pending, g1.pcie_replay) == (False, None, 7)
    assert (g1.nvlink_replay, g1.nvlink_crc) == (10, 0)  # two active links of four, 5 replays each
    assert state.agent.xid_source == "nvml" and state.agent.health_ms is not None
    assert [(e.gpu, e.code, e.pid) for e in state.xid] == [(1, 79, None)]


def _interpreter(version: str) -> str:
    """A real Python of that version (on PATH, else pyenv's), or the test is skipped."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)  # the user's own (tests run with a sealed HOME): only read
    found = next(iter(sorted(home.glob(f".pyenv/versions/{version}.*/bin/python{version}"))), None) or shutil.which(
        "python" + version
    )
    if found and "/shims/" in str(found):
        found = None  # pyenv's shim runs only the versions selected
    if not found:
        cannot_run(f"no Python {version} on this machine (pyenv install {version})")
    return str(found)


def _connect(folder: Path, monkeypatch, opts: SessionOptions):
    monkeypatch.setenv("PATH", str(folder))

    async def go():
        session = HostSession(parse_target("local"), opts)
        await session.connect()
        try:
            return session.opts.python, list(session.state.agent.warnings)
        finally:
            await session.close()

    return asyncio.run(go())


def test_without_a_named_interpreter_another_python_is_found_when_python3_is_too_old(tmp_path, monkeypatch):
    """python3 is a real 3.7 (as on an old host), python3.12 a real 3.6 (the version probe says
    so), python3.11 a real 3.8: the agent runs on that one and says so."""
    os.symlink(_interpreter("3.7"), tmp_path / "python3")
    os.symlink(_interpreter("3.6"), tmp_path / "python3.12")
    os.symlink(_interpreter("3.8"), tmp_path / "python3.11")
    python, warnings = _connect(tmp_path, monkeypatch, SessionOptions())
    assert python == "python3.11"
    assert warnings[0].startswith(
        "python3 cannot run the agent here (Python 3.7 is too old, need >= 3.8): using "
        "python3.11; name one with --python"
    )


def test_with_no_usable_interpreter_every_one_tried_is_said_with_how_to_name_one(tmp_path, monkeypatch):
    os.symlink(_interpreter("3.7"), tmp_path / "python3.9")
    with pytest.raises(CockpitError) as err:
        _connect(tmp_path, monkeypatch, SessionOptions())
    msg = str(err.value)
    assert msg.startswith("local: no Python >= 3.8 to run the agent; tried python3 (not found), python3.13 (not found)")
    assert "python3.9 (Python 3.7)" in msg and "/usr/libexec/platform-python (not found)" in msg
    assert msg.endswith("Name one with --python PATH (or python: in the layout)")


def test_a_named_interpreter_is_used_as_given_never_another(tmp_path, monkeypatch):
    os.symlink(sys.executable, tmp_path / "python3.11")
    with pytest.raises(CockpitError) as err:
        _connect(tmp_path, monkeypatch, SessionOptions(python="python3", python_named=True))
    assert "python3 not found on this machine" in str(err.value) and "--python" in str(err.value)
