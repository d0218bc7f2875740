"""`slurm:JOBID`: a job's nodes (`squeue --json`, else `scontrol -o show job`), and one agent per
node started inside the job with `srun --overlap --jobid J --nodelist N -N1 -n1` (the primitive of
cockpit/link/exec.py). The srun client runs on this machine or on the `@LOGIN-HOST` over ssh.

On each node the agent watches only that node's processes of the job: `scontrol listpids J N`,
run on the node, minus the steps the cockpit started itself (named cockpit-*) and the `extern`
step. The batch script's own processes are watched but marked `batch`: killing the run kills the
job's steps, and the script that waits on them ends the job by itself."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from cockpit.common.errors import CockpitError
from cockpit.link.exec import ExecLink, first_line

AGENT_STEP = "cockpit-agent"
PROBE_STEP = "cockpit-probe"
INSTALL = "install the Slurm client (slurm-client) or name the login host: slurm:JOBID@LOGIN-HOST"
# Slurm signals a job's steps with SIGTERM when the job ends (the run killed, the batch script
# done): the agent ignores it so that it can finish answering the kill that ended the job; it ends
# when its stdin closes, or with the SIGKILL Slurm sends KillWait later.
_KEEP = 'trap "" TERM; exec "$0" "$@"'


@dataclass
class Job:
    id: str
    state: str
    nodes: list[str]
    batch_host: str | None = None
    reason: str | None = None
    name: str | None = None


@dataclass
class NodePids:
    """The job's processes on one node: pid -> step id (`0`, `1`, `batch`)."""

    steps: dict[int, str] = field(default_factory=dict)

    @property
    def pids(self) -> list[int]:
        return sorted(self.steps)


def parse_listpids(text: str, skip_steps: set[str]) -> NodePids:
    out = NodePids()
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 3 and cols[0].isdigit():
            step = cols[2]
            if step in skip_steps or step == "extern":
                continue
            out.steps[int(cols[0])] = step
    return out


def _state(value) -> str:
    if isinstance(value, list):  # 23.02 and later: a list of flags
        return str(value[0]) if value else "?"
    return str(value or "?")


def parse_squeue_json(text: str, job: str) -> dict | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    for j in doc.get("jobs") or []:
        if str(j.get("job_id")) == job or f"{j.get('array_job_id')}_{j.get('array_task_id')}" == job:
            return j
    return None


def parse_scontrol_job(text: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))


class SlurmNodeLink(ExecLink):
    name = "slurm"
    tool = "srun"
    install_hint = INSTALL

    def __init__(self, carrier, target, where: str):
        super().__init__(carrier, target.label, where)
        self.job = target.name
        self.node = target.node

    def wrap(self, argv, env=None, agent=False):
        export = ["--export=ALL," + ",".join(f"{k}={v}" for k, v in sorted(env.items()))] if env else []
        step = ["-J", AGENT_STEP if agent else PROBE_STEP]
        keep = ["/bin/sh", "-c", _KEEP] if agent else []
        return [
            "srun",
            "--overlap",
            "--jobid",
            self.job,
            "--nodelist",
            self.node,
            "-N1",
            "-n1",
            "--quiet",
            *step,
            *export,
            *keep,
            *argv,
        ]

    async def check(self) -> None:
        job = await find_job(self, self.job)
        if self.node not in job.nodes:
            raise CockpitError(
                f"{self.label}: job {self.job} does not run on {self.node} (its nodes: {', '.join(job.nodes)})"
            )

    async def job_pids(self) -> NodePids:
        """This node's processes of the job, the cockpit's own steps left out."""
        probe = ["/bin/sh", "-c", 'echo "step $SLURM_STEP_ID"; exec scontrol listpids "$0" "$1"', self.job, self.node]
        res = await self.tool_run(self.wrap(probe), timeout=30)
        if res.rc != 0:
            raise CockpitError(
                f"{self.label}: cannot list the job's processes on {self.node}: "
                f"{first_line(res.stderr) or f'status {res.rc}'}"
            )
        text = res.stdout.decode("utf-8", "replace")
        own = {line.split()[1] for line in text.splitlines() if line.startswith("step ") and len(line.split()) > 1}
        return parse_listpids(text, own | await self.own_steps())

    async def own_steps(self) -> set[str]:
        res = await self.tool_run(["squeue", "--steps", "--jobs", self.job, "--noheader", "--format", "%i %j"])
        out = set()
        for line in res.stdout.decode("utf-8", "replace").splitlines():
            sid, _, name = line.strip().partition(" ")
            if name.startswith("cockpit-") and "." in sid:
                out.add(sid.split(".", 1)[1])
        return out

    def describe(self) -> dict:
        return {"kind": "slurm", "job": self.job, "node": self.node, "via": self.where}


async def find_job(link: ExecLink, job: str) -> Job:
    """The job's state and nodes, from `squeue --json` (Slurm >= 21.08), else `scontrol -o show
    job`; one line naming the job and the fix when it is not there or not running."""
    res = await link.tool_run(["squeue", "--json", "--jobs", job])
    where = link.where
    info: dict | None = None
    if res.rc == 0:
        j = parse_squeue_json(res.stdout.decode("utf-8", "replace"), job)
        if j is not None:
            info = {
                "JobState": _state(j.get("job_state")),
                "NodeList": j.get("nodes") or "",
                "BatchHost": j.get("batch_host"),
                "Reason": j.get("state_reason"),
                "JobName": j.get("name"),
            }
    if info is None:
        res2 = await link.tool_run(["scontrol", "-o", "show", "job", job])
        if res2.rc != 0:
            err = first_line(res2.stderr) or first_line(res.stderr)
            if "invalid job id" in err.lower() or res2.rc == 1:
                raise CockpitError(
                    f"slurm:{job}: no such job on {where} (it ended, or the id is wrong: `squeue --me` lists yours)"
                )
            raise CockpitError(f"slurm:{job}: Slurm on {where} did not answer: {err}")
        info = parse_scontrol_job(res2.stdout.decode("utf-8", "replace"))
    state = str(info.get("JobState") or "?").upper()
    if state != "RUNNING":
        why = f" ({info.get('Reason')})" if info.get("Reason") not in (None, "", "None") else ""
        raise CockpitError(
            f"slurm:{job}: the job is {state}{why}, not RUNNING: no node to watch "
            f"{'yet (wait for it to start)' if state == 'PENDING' else '(squeue shows its state)'}"
        )
    nodes = await expand_nodes(link, str(info.get("NodeList") or ""))
    if not nodes:
        raise CockpitError(f"slurm:{job}: the job lists no nodes on {where}")
    return Job(job, state, nodes, info.get("BatchHost"), info.get("Reason"), info.get("JobName"))


async def expand_nodes(link: ExecLink, nodelist: str) -> list[str]:
    """`n[1-2],gpu7` to its names, as Slurm expands them (`scontrol show hostnames`)."""
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    if "[" not in nodelist:
        return [n for n in nodelist.split(",") if n]
    res = await link.tool_run(["scontrol", "show", "hostnames", nodelist])
    return [n for n in res.stdout.decode().split() if n]
