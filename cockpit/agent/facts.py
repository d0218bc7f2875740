"""Host facts for the bundle: nvidia-smi -q, Xid lines, the versions of the packages a rank imports."""

import os
import platform
import re
import subprocess

from .flightrec import _read_regular
from .procs import _uid


def _run_argv(argv, timeout):
    """(rc, stdout, stderr) of an argument list, never a shell; rc None when it could not run."""
    try:
        out = subprocess.run(argv, capture_output=True, timeout=timeout)
    except FileNotFoundError:
        return None, "", "%s: not found on the host" % argv[0]
    except subprocess.TimeoutExpired:
        return None, "", "%s: no answer in %.0f s" % (" ".join(argv), timeout)
    except OSError as exc:
        return None, "", "%s: %s" % (argv[0], exc.strerror or exc)
    return (
        out.returncode,
        out.stdout.decode("utf-8", "replace")[: 8 << 20],
        out.stderr.decode("utf-8", "replace")[:4000],
    )


VERSION_PACKAGES = (
    "torch",
    "sglang",
    "vllm",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "flashinfer-python",
    "triton",
    "transformers",
    "cuda-python",
)
METADATA_MAX = 1 << 20


def _dist_name(name):
    """A distribution's name as its dist-info folder spells it (PEP 503 normalized, `_` for `-`)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def package_versions(sites, uids):
    """The run's package versions from their metadata on disk (`NAME-VER.dist-info/METADATA`'s
    `Version:` line), read as text: nothing of the run is imported nor run, so a file planted in
    its folders never runs as the agent's user. Folders are taken as they are (no symlink
    followed), files only when regular, small and owned by one of `uids`."""
    import stat

    want = {_dist_name(n): n for n in VERSION_PACKAGES}
    out, refused = {n: None for n in VERSION_PACKAGES}, []
    for site in sites:
        try:
            entries = sorted(os.listdir(site))
        except OSError:
            continue
        for entry in entries:
            name = want.get(_dist_name(entry.split("-", 1)[0])) if entry.endswith(".dist-info") else None
            if name is None or out[name] is not None:
                continue
            folder = os.path.join(site, entry)
            try:
                if not stat.S_ISDIR(os.lstat(folder).st_mode):
                    raise OSError("not a folder")
                data, _ = _read_regular(os.path.join(folder, "METADATA"), METADATA_MAX, uids)
            except OSError as exc:
                refused.append("%s: %s" % (folder, exc.strerror or exc))
                continue
            for line in data.decode("utf-8", "replace").splitlines()[:400]:
                if not line.strip():
                    break  # the headers end at the first empty line
                if line.startswith("Version:"):
                    out[name] = line[8:].strip()[:64] or None
                    break
    return out, refused


def _site_dirs(pid):
    """The package folders a process really imports from, read from the files it has mapped:
    /proc/PID/exe names the base interpreter behind a virtualenv's symlink, whose own
    site-packages lack the run's torch."""
    found = []
    try:
        with open("/proc/%d/maps" % pid) as fh:
            for line in fh:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                for marker in ("/site-packages/", "/dist-packages/"):
                    cut = path.find(marker)
                    if cut > 0:
                        site = path[: cut + len(marker) - 1]
                        if site not in found:
                            found.append(site)
    except OSError:
        pass
    return found[:8]


def host_facts(items, pids=(), driver=None, nvml=None):
    """What a hang report needs from the host itself: `nvidia_smi` (nvidia-smi -q), `xid` (the
    kernel log's NVRM Xid lines, from dmesg or journalctl -k), `versions` (driver and CUDA from
    NVML, the engine's packages from their metadata in the run's package folders, read as text:
    nothing is run on behalf of a host process).
    Each item is {"text": ...} or {"error": why}."""
    out = {}
    if "nvidia_smi" in items:
        rc, text, err = _run_argv(["nvidia-smi", "-q"], 60)
        out["nvidia_smi"] = {"text": text} if rc == 0 else {"error": (err or text).strip()[:300] or "exit %s" % rc}
    if "xid" in items:
        tried = []
        for argv in (["dmesg", "--ctime"], ["dmesg"], ["journalctl", "-k", "--no-pager", "-q", "-n", "50000"]):
            rc, text, err = _run_argv(argv, 30)
            if rc == 0 and text.strip():
                lines = [line for line in text.splitlines() if "NVRM: Xid" in line or "Xid (" in line]
                out["xid"] = {
                    "text": "\n".join(lines[-2000:]),
                    "source": " ".join(argv),
                    "lines_read": len(text.splitlines()),
                    "count": len(lines),
                }
                break
            tried.append(
                "%s: %s"
                % (
                    " ".join(argv),
                    (err or text).strip().splitlines()[0][:160] if (err or text).strip() else "exit %s" % rc,
                )
            )
        else:
            out["xid"] = {"error": "; ".join(tried)}
    if "versions" in items:
        v = {"driver": driver, "nvml": nvml, "agent_python": platform.python_version()}
        if nvml and nvml not in ("sim", "nvidia-smi"):
            try:
                if nvml == "nvml-ctypes":
                    from . import nvml as pynvml  # already initialised by the sampler
                else:
                    import pynvml

                cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
                v["cuda_driver"] = "%d.%d" % (cuda // 1000, (cuda % 1000) // 10)
            except Exception:
                pass
        exe, sites, uid = None, [], None
        for pid in pids:
            try:
                exe = os.readlink("/proc/%d/exe" % int(pid))
            except (OSError, ValueError):
                continue
            sites, uid = _site_dirs(int(pid)), _uid(int(pid))
            break
        if exe and uid is not None:
            found, refused = package_versions(sites, {uid, 0, os.geteuid()})
            py = next((m.group(1) for m in (re.search(r"/python(\d+\.\d+)/", s) for s in sites) if m), None)
            v["run"] = dict(found, python=py, interpreter=exe, read_from="package metadata")
            if refused:
                v["run_refused"] = refused[:20]
        else:
            v["run_error"] = "no live process of the run to read its packages' versions from"
        out["versions"] = {"data": v}
    return out
