"""A simulated SGLang / vLLM server made of real processes, a real log, a real port and real shm
files, for hosts without GPUs: what `cockpit demo`, the UI tests and the screenshots run against.

It takes SGLang's `launch_server` command line (and, with `--engine vllm`, shapes itself like vLLM)
and reproduces failures from the field, chosen by flags:

  --speculative-algorithm EAGLE3   every rank blocks in a collective while capturing the draft
                                   CUDA graph: 0 % CPU, 0 % GPU, memory resident, port never opens
  --sim-hang-rank K                rank K spins in the sampler after serving starts; the others
                                   wait in an all-reduce: their GPUs at 100 % and idle power,
                                   rank K's GPU idle, tokens frozen (as measured on H200s)
  --sim-capture-hang-rank K        rank K stops while capturing CUDA graphs, outside any collective;
                                   the others wait for it in an all-reduce: the launch hangs
                                   before its port opens (the H200 case of docs/VALIDATION.md)
  --sim-store-port                 the server listens on a port of its own from the start, as
                                   torch's TCPStore does, long before the server's port opens
  --sim-crash-rank K               rank K dies (SIGKILL, exit -9) while loading weights
  --sim-xid-rank K [--sim-xid N]   once serving, the GPU of rank K reports Xid N (79 by default:
                                   fallen off the bus, and the GPU is then lost); rank K dies
  --sim-lost-rank K                once serving, the GPU of rank K is lost (NVML answers
                                   GPU_IS_LOST, no event) and rank K dies
  --sim-remap-rank K               the GPU of rank K has an uncorrected ECC error and a row
                                   remap pending (a reset applies it); the run goes on
  --sim-slowdown-rank K            the GPU of rank K is held down by the hardware (HW slowdown)
  --sim-hang-part NAME             (repeatable) with two distinct parts, every rank blocks in a
                                   collective after capturing CUDA graphs, as EAGLE-3 does: a
                                   hang that needs two flag sets together (each passes one part)
  --sim-hang-prob P                every rank blocks the same way at a launch with probability P
                                   (a flaky hang); the draw is seeded by --sim-seed and the
                                   count of such launches kept in --sim-state, so a sequence of
                                   launches repeats
  --sim-stall-at PHASE             every rank blocks in a collective at that point (init, load,
                                   kv, capture, serving): the seed's hang moved to each phase
  --sim-jit-s S                    healthy, silent: every rank compiles kernels on the CPU for S
                                   (real) seconds after its KV cache, the log silent
  --sim-late-node-s S              healthy, silent: every rank waits S seconds in the rendezvous
                                   for a node that comes late (a socket polled, 0 % CPU)
  --sim-slow-disk-s S              healthy, silent: the weights are read from a slow disk for S
                                   seconds before the first shard's line (a real file read)
  --sim-leak-shm                   leaves nccl-, psm_ and sgl_shm_ entries in the shm folder
  --sim-orphans                    workers outlive a SIGKILLed parent and keep their GPU memory

Function names along each rank's stack say where it is (load_model, capture_draft_cuda_graph,
all_reduce...), so py-spy dumps of the simulated ranks are worth reading.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import select
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cockpit.sim import fakenvml
from cockpit.sim.flightrec import SimFlightRecorder

MODEL_GB = 496.0  # a 1T-parameter MoE in INT4, across all ranks
DRAFT_GB = 2.0
SHARDS = 64
STALL_POINTS = ("init", "load", "kv", "capture", "serving")


# ----------------------------------------------------------------------------- args


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m cockpit.sim.server", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("sglang", "vllm"), default="sglang")
    p.add_argument("--model-path", "--model", dest="model_path", default="/shared/kimi-k2.5-int4")
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--mem-fraction-static", "--gpu-memory-utilization", dest="mem_fraction", type=float, default=0.88)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-draft-model-path", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--disable-cuda-graph", "--enforce-eager", dest="disable_cuda_graph", action="store_true")
    p.add_argument("--cuda-graph-max-bs", type=int, default=160)
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--api-key", default=None, help="accepted as SGLang does (the simulated server checks nothing)")
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--nnodes", type=int, default=1, help="nodes the run spans; this one holds tp-size/nnodes ranks")
    p.add_argument("--node-rank", type=int, default=0, help="this node's place: its ranks are global (TP4, TP5...)")
    p.add_argument(
        "--sim-dist-dir",
        default=None,
        help="a folder the nodes share: a rank hung on one node stalls the collective on all",
    )
    p.add_argument("--sim-hang-rank", type=int, default=None)
    p.add_argument("--sim-capture-hang-rank", type=int, default=None)
    p.add_argument("--sim-store-port", action="store_true")
    p.add_argument("--sim-crash-rank", type=int, default=None)
    p.add_argument("--sim-xid-rank", type=int, default=None)
    p.add_argument("--sim-xid", type=int, default=79)
    p.add_argument("--sim-lost-rank", type=int, default=None)
    p.add_argument("--sim-remap-rank", type=int, default=None)
    p.add_argument("--sim-slowdown-rank", type=int, default=None)
    p.add_argument("--sim-hang-part", action="append", default=[], metavar="NAME")
    p.add_argument("--sim-hang-prob", type=float, default=0.0, metavar="P")
    p.add_argument("--sim-stall-at", choices=STALL_POINTS, default=None)
    p.add_argument("--sim-jit-s", type=float, default=0.0, metavar="S")
    p.add_argument("--sim-late-node-s", type=float, default=0.0, metavar="S")
    p.add_argument("--sim-slow-disk-s", type=float, default=0.0, metavar="S")
    p.add_argument("--sim-leak-shm", action="store_true")
    p.add_argument("--sim-orphans", action="store_true")
    p.add_argument(
        "--sim-traffic",
        type=float,
        default=0.0,
        metavar="REQ_S",
        help="send this many completion requests a second to itself once ready",
    )
    p.add_argument("--sim-speed", type=float, default=1.0, help="time runs this many times faster")
    p.add_argument("--sim-seed", type=int, default=1)
    p.add_argument("--sim-state", default=os.environ.get("COCKPIT_SIM_STATE"), help="the simulated NVML's folder")
    p.add_argument("--sim-shm-dir", default="/dev/shm")
    args = p.parse_args(argv)
    if args.tp_size < 1:
        p.error("--tp-size must be >= 1")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes or args.tp_size % args.nnodes:
        p.error("--nnodes must divide --tp-size and --node-rank be in 0..nnodes-1")
    args.local_tp = args.tp_size // args.nnodes
    args.first_rank = args.node_rank * args.local_tp
    return args


class Clock:
    def __init__(self, speed: float):
        self.speed = max(0.01, speed)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds / self.speed)


# ----------------------------------------------------------------------------- log lines


class Log:
    """Writes lines in the engine's own format, each with one write() so ranks never interleave."""

    def __init__(self, engine: str, who: str):
        self.engine, self.who = engine, who

    def __call__(self, msg: str, level: str = "INFO", where: str = "model_runner.py:312") -> None:
        now = time.localtime()
        if self.engine == "sglang":
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", now)
            prefix = f"[{stamp} {self.who}] " if self.who else f"[{stamp}] "
            line = prefix + msg
        else:
            stamp = time.strftime("%m-%d %H:%M:%S", now)
            line = f"({self.who} pid={os.getpid()}) {level} {stamp} [{where}] {msg}"
        os.write(1, (line + "\n").encode())

    def raw(self, msg: str) -> None:
        os.write(1, (msg + "\n").encode())


# ----------------------------------------------------------------------------- ranks


class Rank:
    """One TP rank: the scheduler (SGLang) or worker (vLLM) process holding GPU `gpu`."""

    def __init__(self, args: argparse.Namespace, rank: int, shared: dict):
        self.args, self.rank, self.shared = args, rank, shared
        self.gpu = args.base_gpu_id + rank - args.first_rank  # ranks are global, GPUs the node's own
        self.clock = Clock(args.sim_speed)
        who = f"TP{rank}" if args.engine == "sglang" else f"Worker_TP{rank}"
        self.log = Log(args.engine, who if args.tp_size > 1 or args.engine == "vllm" else "")
        self.total_mib = fakenvml.MODELS["rtx-pro-6000"]["mem_total_mib"]
        self.used_mib = 0
        self.activity = "idle"
        self.held = []
        self.fr = SimFlightRecorder(rank, args.tp_size)  # armed only by the forensics environment

    def publish(self, used_mib: float | None = None, activity: str | None = None) -> None:
        if used_mib is not None:
            self.used_mib = int(used_mib)
        if activity is not None:
            self.activity = activity
        if self.args.sim_state:
            fakenvml.register(self.args.sim_state, os.getpid(), self.gpu, self.used_mib, self.activity)

    def gb(self, mib: float) -> str:
        return f"{mib / 1024:.2f}"

    def avail(self) -> str:
        return self.gb(self.total_mib - self.used_mib)

    # Each method below is a frame a py-spy dump of this rank shows.

    def init_torch_distributed(self) -> None:
        self.log("Init torch distributed begin.")
        self.publish(600, "load")
        if self.args.sim_leak_shm:
            self.held.append(
                make_shm(self.args.sim_shm_dir, f"nccl-{rand_tag(self.args, self.rank)}", 4 << 20, hold=True)
            )
        self.clock.sleep(0.4)
        if self.args.sim_late_node_s:
            rendezvous_wait_for_nodes(self)
        self.log("Init torch distributed ends. mem usage=0.59 GB")

    def load_model(self) -> None:
        args = self.args
        weights_mib = min(MODEL_GB / args.tp_size, self.total_mib / 1024 * 0.8) * 1024
        self.log(f"Load weight begin. avail mem={self.avail()} GB")
        start = time.monotonic()
        if args.sim_slow_disk_s:
            read_weights_from_disk(self)
        for shard in range(1, SHARDS + 1):
            if shard == SHARDS // 2:
                stall_at(self, "load")
            self.clock.sleep(0.08)
            self.publish(600 + weights_mib * shard / SHARDS)
            if self.rank == args.sim_crash_rank and shard == SHARDS // 3:
                os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer's way: exit -9, no message
            if self.rank == 0:
                pct = shard * 100 // SHARDS
                el = (time.monotonic() - start) * self.clock.speed
                rate = shard / el if el else 0.0
                left = (SHARDS - shard) / rate if rate else 0.0
                self.log.raw(
                    f"Loading safetensors checkpoint shards: {pct:3d}% Completed | {shard}/{SHARDS} "
                    f"[{fmt_mmss(el)}<{fmt_mmss(left)}, {rate:.2f}it/s]"
                )
        if args.speculative_draft_model_path or args.speculative_algorithm:
            self.publish(self.used_mib + DRAFT_GB * 1024)
        kind = "DeepseekV3ForCausalLM"
        if args.engine == "sglang":
            self.log(
                f"Load weight end. type={kind}, dtype=torch.bfloat16, avail mem={self.avail()} GB, "
                f"mem usage={self.gb(self.used_mib - 600)} GB."
            )
        else:
            self.log(
                f"Model loading took {self.gb(self.used_mib - 600)} GiB and {time.monotonic() - start:.2f} seconds",
                where="gpu_model_runner.py:2010",
            )

    def allocate_kv_cache(self) -> None:
        target = self.total_mib * self.args.mem_fraction
        kv_mib = max(256.0, target - self.used_mib)
        self.clock.sleep(0.4)
        self.publish(self.used_mib + kv_mib)
        tokens = int(kv_mib * 18.7)
        if self.args.engine == "sglang":
            self.log(
                f"KV Cache is allocated. #tokens: {tokens}, K size: {self.gb(kv_mib / 2)} GB, V size: {self.gb(kv_mib / 2)} GB"
            )
        else:
            self.log(f"GPU KV cache size: {tokens:,} tokens", where="kv_cache_utils.py:868")

    def capture_cuda_graph(self) -> None:
        if self.args.disable_cuda_graph:
            return
        self.publish(activity="capture")
        start = time.monotonic()
        if self.args.engine == "sglang":
            self.log(f"Capture cuda graph begin. This can take up to several minutes. avail mem={self.avail()} GB")
            if self.rank == self.args.sim_capture_hang_rank:
                self.wait_for_graph_pool()
            stall_at(self, "capture")
            if self.args.sim_capture_hang_rank is not None:
                self.publish(activity="blocked")  # waiting in the collective for the rank that never comes
            for _bs in range(8):
                self.all_reduce()
                self.clock.sleep(0.1)
            self.log(
                f"Capture cuda graph end. Time elapsed: {time.monotonic() - start:.2f} s. mem usage=0.09 GB. "
                f"avail mem={self.avail()} GB."
            )
        else:
            for step in range(1, 36):
                self.all_reduce()
                self.clock.sleep(0.025)
                if self.rank == 0 and step % 7 == 0:
                    self.log.raw(
                        f"Capturing CUDA graphs (decode, FULL): {step * 100 // 35}%|{'#' * (step // 4)}| {step}/35"
                    )
            self.log(
                f"Graph capturing finished in {int(time.monotonic() - start)} secs, took 0.52 GiB",
                where="gpu_model_runner.py:2650",
            )
        if self.args.speculative_algorithm:
            self.capture_draft_cuda_graph()

    def wait_for_graph_pool(self) -> None:
        """A rank that never reaches the capture's collective: the others wait in it for good."""
        self.publish(activity="idle")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)

    def capture_draft_cuda_graph(self) -> None:
        self.log(f"Capture draft cuda graph begin. This can take up to several minutes. avail mem={self.avail()} GB")
        if (self.args.speculative_algorithm or "").upper() in ("EAGLE3", "EAGLE"):
            self.eagle_draft_forward()
        self.log("Capture draft cuda graph end. Time elapsed: 0.80 s. mem usage=0.05 GB.")

    def eagle_draft_forward(self) -> None:
        """The operator story: the draft model's collective never completes on any rank."""
        self.publish(activity="blocked")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a rank stuck in CUDA ignores SIGTERM
        self.all_reduce(draft=True)

    def warmup_collective(self) -> None:
        """The two-part and the flaky hang: a warm-up collective that never completes on any
        rank (the draft barrier waits for one party more than there are ranks)."""
        self.log("Warm-up collective begin.")
        self.publish(activity="blocked")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.all_reduce(draft=True)

    def all_reduce(self, draft: bool = False) -> None:
        if peer_hung(self.args):  # a rank on another node never joins: the collective never completes
            self.fr.enqueue()
            self.publish(activity="spin")
            while True:
                time.sleep(1)
        barrier = self.shared["draft_barrier" if draft else "barrier"]
        self.fr.enqueue()
        barrier.wait()
        self.fr.complete()

    def event_loop(self) -> None:
        """Serve forward steps: one all-reduce per decode step while tokens are wanted."""
        shared = self.shared
        steps = 0
        last_work = 0.0
        while True:
            if shared["pending"].value <= 0:
                if self.activity != "idle" and time.monotonic() - last_work > 1.5:
                    self.publish(activity="idle")  # NVML averages over its sample window
                time.sleep(0.05)
                continue
            last_work = time.monotonic()
            if self.activity != "busy":
                self.publish(activity="busy")
            if self.rank == self.args.sim_hang_rank and steps >= 40:
                self.sample_tokens()
            if steps >= 40:
                stall_at(self, "serving")
            self.all_reduce()
            steps += 1
            if self.rank == 0:
                with shared["pending"].get_lock():
                    shared["pending"].value = max(0, shared["pending"].value - 1)
                with shared["generated"].get_lock():
                    shared["generated"].value += 1
            self.clock.sleep(0.02)

    def sample_tokens(self) -> None:
        """The odd rank out: spins in the sampler on the CPU and never joins the next all-reduce;
        its GPU has nothing to run (idle), while the others' GPUs poll in the collective."""
        self.publish(activity="idle")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.shared["spinning"].value = 1
        if self.args.sim_dist_dir:
            open(os.path.join(self.args.sim_dist_dir, "hung"), "w").close()
        while True:
            pass


# The engines' own words the simulated host speaks: its copy of cockpit/engines/ (it travels alone),
# checked equal by tests/engines/test_engines.py.
TITLES = {"sglang": "sglang::", "vllm": "VLLM::"}  # the ranks' process-title prefixes
METRICS = {  # engine -> (name, type, help, the value it reports) as the engine exports them
    "sglang": (
        ("prompt_tokens_total", "counter", "Number of prefill tokens processed.", "prompt"),
        ("generation_tokens_total", "counter", "Number of generation tokens processed.", "generated"),
        ("num_running_reqs", "gauge", "The number of running requests.", "running"),
        ("num_queue_reqs", "gauge", "The number of requests in the waiting queue.", "waiting"),
        ("token_usage", "gauge", "The token usage.", "kv"),
    ),
    "vllm": (
        ("prompt_tokens_total", "counter", "Number of prefill tokens processed.", "prompt"),
        ("generation_tokens_total", "counter", "Number of generation tokens processed.", "generated"),
        ("num_requests_running", "gauge", "Number of requests in model execution batches.", "running"),
        ("num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "waiting"),
        ("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", "kv"),
    ),
}


def run_scheduler_process(args, rank, shared, ready) -> None:
    """Entry point of one rank's process (the name SGLang uses)."""
    import setproctitle

    title = TITLES[args.engine] + (f"scheduler_TP{rank}" if args.engine == "sglang" else f"Worker_TP{rank}")
    setproctitle.setproctitle(title)
    watch_parent(args)
    r = Rank(args, rank, shared)
    r.init_torch_distributed()
    stall_at(r, "init")
    r.load_model()
    r.allocate_kv_cache()
    stall_at(r, "kv")
    if args.sim_jit_s:
        jit_compile_kernels(r)
    r.capture_cuda_graph()
    if args.sim_deadlock:
        r.warmup_collective()
    ready.put(rank)
    r.publish(activity="idle")
    watch_spin(r)
    if rank in (args.sim_xid_rank, args.sim_lost_rank):
        threading.Thread(target=gpu_falls, args=(r,), daemon=True).start()
    r.event_loop()


def stall_at(rank: Rank, where: str) -> None:
    """--sim-stall-at: every rank blocks in a collective here (the draft barrier waits for one
    party more than there are ranks), its GPU idle: the seed's hang, moved to this phase."""
    if rank.args.sim_stall_at != where:
        return
    rank.publish(activity="blocked")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank.all_reduce(draft=True)


# Healthy phases that are silent in the log yet moving: never a stall.


def jit_compile_kernels(rank: Rank) -> None:
    """--sim-jit-s: kernels compiled on the CPU by the first rank (as DeepGEMM's JIT does at
    start, the others waiting for its cache in a collective), the log silent meanwhile; that
    rank's CPU busy, its stack moving."""
    if rank.rank == rank.args.first_rank:
        deadline = time.monotonic() + rank.args.sim_jit_s
        n = 0
        while time.monotonic() < deadline:
            n = compile_one_kernel(n)
    rank.all_reduce()


def compile_one_kernel(n: int) -> int:
    x = n
    for i in range(20000):
        x = (x * 1103515245 + i) & 0xFFFFFFFF
    return x


def rendezvous_wait_for_nodes(rank: Rank) -> None:
    """--sim-late-node-s: the rendezvous waits for a node that comes late, polling its socket
    (0 % CPU, the log silent), as torch's store-based rendezvous does until the timeout."""
    store = socket.socketpair()
    deadline = time.monotonic() + rank.args.sim_late_node_s
    while time.monotonic() < deadline:
        select.select([store[0]], [], [], min(1.0, max(0.01, deadline - time.monotonic())))
    store[0].close()
    store[1].close()


def read_weights_from_disk(rank: Rank) -> None:
    """--sim-slow-disk-s: a huge checkpoint read from a slow disk before the loader prints
    anything: a real file read chunk by chunk at a slow disk's pace (the rank's read bytes grow,
    its CPU near idle), the log silent."""
    folder = rank.args.sim_state or rank.args.sim_shm_dir
    path = os.path.join(folder, f"weights-rank{rank.rank}.bin")
    with open(path, "wb") as fh:
        fh.write(os.urandom(1 << 20) * 4)
    deadline = time.monotonic() + rank.args.sim_slow_disk_s
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            while time.monotonic() < deadline:
                if not os.read(fd, 1 << 20):
                    os.lseek(fd, 0, os.SEEK_SET)
                time.sleep(0.1)  # the disk's pace: 10 MiB/s
        finally:
            os.close(fd)
    finally:
        os.unlink(path)


def gpu_falls(rank: Rank) -> None:
    """The GPU of this rank fails once the server serves: the driver's Xid (and, for 79, the GPU
    lost), the CUDA error the rank then hits, and its death."""
    args = rank.args
    rank.clock.sleep(3.0)
    if args.sim_state:
        if rank.rank == args.sim_xid_rank:
            fakenvml.xid(args.sim_state, rank.gpu, args.sim_xid)
        if rank.rank == args.sim_lost_rank or args.sim_xid == 79:
            fakenvml.fault(args.sim_state, rank.gpu, lost=True)
    time.sleep(0.5)
    rank.log("Scheduler hit an exception: RuntimeError: CUDA error: unspecified launch failure", level="ERROR")
    os._exit(1)


def watch_spin(rank: Rank) -> None:
    """When another rank spins, the ones waiting in the collective show NCCL's signature too:
    a kernel polling at 100 % utilization and idle power."""

    def loop():
        while True:
            time.sleep(0.1)
            if (
                (rank.shared["spinning"].value or peer_hung(rank.args))
                and rank.activity != "spin"
                and rank.rank != rank.args.sim_hang_rank
            ):
                rank.publish(activity="spin")

    threading.Thread(target=loop, daemon=True, name="nccl-watchdog").start()


def peer_hung(args) -> bool:
    return bool(args.sim_dist_dir) and os.path.exists(os.path.join(args.sim_dist_dir, "hung"))


def watch_parent(args) -> None:
    """SGLang's workers kill themselves when their parent dies; with --sim-orphans they don't
    (vllm 55510: the workers keep the GPUs after the API server is SIGKILLed)."""
    if args.sim_orphans:
        return
    parent = os.getppid()

    def loop():
        while True:
            time.sleep(0.2)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=loop, daemon=True, name="parent-watch").start()


def run_detokenizer_process(args) -> None:
    import setproctitle

    setproctitle.setproctitle(TITLES["sglang"] + "detokenizer")
    watch_parent(args)
    while True:
        time.sleep(1)


def run_engine_core(args, shared, ready) -> None:
    """vLLM: EngineCore owns the workers, which are its children."""
    import setproctitle

    setproctitle.setproctitle(TITLES["vllm"] + "EngineCore")
    watch_parent(args)
    ctx = mp.get_context("spawn")
    inner = ctx.Queue()
    workers = [ctx.Process(target=run_scheduler_process, args=(args, r, shared, inner)) for r in range(args.tp_size)]
    for w in workers:
        w.start()
    for _ in workers:
        inner.get()
    ready.put("engine")
    for w in workers:
        w.join()


def flaky_hang(args) -> bool:
    """Whether this launch hangs under --sim-hang-prob: the n-th such launch on a simulated host
    draws from (seed, n), so the same sequence of launches hangs the same way."""
    if args.sim_hang_prob <= 0:
        return False
    if not args.sim_state:
        return random.random() < args.sim_hang_prob
    fd = os.open(os.path.join(args.sim_state, "flaky-launches"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, b".")  # one byte per launch, appended: the count is the file's size
        n = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return random.Random(f"{args.sim_seed}/flaky/{n}").random() < args.sim_hang_prob


# ----------------------------------------------------------------------------- shm


def rand_tag(args, salt) -> str:
    rng = random.Random(f"{args.sim_seed}/{salt}")
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") for _ in range(6))


def make_shm(folder: str, name: str, size: int, hold: bool):
    """A real file in the shm folder; when held, this process keeps it open and mapped."""
    import mmap

    path = os.path.join(folder, name)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, size)
    if not hold:
        os.close(fd)
        return None
    return fd, mmap.mmap(fd, size)


# ----------------------------------------------------------------------------- HTTP


class Server:
    """The launching process: HTTP server and tokenizer manager, like SGLang's."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.clock = Clock(args.sim_speed)
        self.log = Log(args.engine, "" if args.engine == "sglang" else "APIServer")
        self.ready = False
        ctx = mp.get_context("spawn")
        self.ctx = ctx
        self.shared = {
            "barrier": ctx.Barrier(args.local_tp),
            "draft_barrier": ctx.Barrier(args.local_tp + 1),
            "pending": ctx.Value("q", 0),
            "generated": ctx.Value("q", 0),
            "spinning": ctx.Value("i", 0),
        }
        args.sim_deadlock = len(set(args.sim_hang_part)) >= 2 or flaky_hang(args)  # one draw per launch, every rank's
        self.prompt_tokens = 0
        self.running = 0  # requests in flight: a hang keeps them running while the counters freeze
        self.children: list = []

    def metrics_text(self) -> str:
        """Prometheus text shaped like the engine's own: SGLang's families (labelled per TP rank 0,
        as SGLang exports them) or vLLM's. The token counter is the ranks' own: it freezes with
        them when a rank hangs, while requests stay running."""
        gen = self.shared["generated"].value
        kv = min(0.95, 0.02 + 0.001 * self.running + (0.05 if self.running else 0.0))
        model = self.args.model_path.replace("\\", "\\\\").replace('"', '\\"')
        if self.args.engine == "sglang":
            lab = f'{{model_name="{model}",engine_type="unified",tp_rank="0",pp_rank="0"}}'
        else:
            lab = f'{{engine="0",model_name="{model}"}}'
        pre = self.args.engine
        values = {
            "prompt": self.prompt_tokens,
            "generated": gen,
            "running": self.running,
            "waiting": 0,
            "kv": round(kv, 4),
        }
        out = []
        for name, kind, help_, what in METRICS[pre]:
            value = values[what]
            out += [
                f"# HELP {pre}:{name} {help_}",
                f"# TYPE {pre}:{name} {kind}",
                f"{pre}:{name}{lab} {float(value)!r}",
            ]
        return "\n".join(out) + "\n"

    def start(self) -> int:
        args = self.args
        self.gpu_faults()
        self.log(
            f"server_args=ServerArgs(model_path='{args.model_path}', tp_size={args.tp_size}, "
            f"mem_fraction_static={args.mem_fraction}, host='{args.host}', port={args.port}, "
            f"speculative_algorithm={args.speculative_algorithm!r}, disable_cuda_graph={args.disable_cuda_graph})"
        )
        if args.sim_leak_shm:
            make_shm(args.sim_shm_dir, f"sgl_shm_tokenizer_{os.getpid()}_{rand_tag(args, 'tok')}", 1 << 20, hold=False)
            make_shm(args.sim_shm_dir, f"psm_{rand_tag(args, 'psm')}", 1 << 16, hold=False)
        if args.sim_store_port:
            self.store = socket.create_server(("127.0.0.1", 0))  # torch's TCPStore: up before the ranks
        ready = self.ctx.Queue()
        if args.engine == "sglang":
            for r in range(args.first_rank, args.first_rank + args.local_tp):
                self.children.append(
                    self.ctx.Process(
                        target=run_scheduler_process, args=(args, r, self.shared, ready), name=f"scheduler_TP{r}"
                    )
                )
            self.children.append(self.ctx.Process(target=run_detokenizer_process, args=(args,), name="detokenizer"))
            expect = args.local_tp
        else:
            self.children.append(
                self.ctx.Process(target=run_engine_core, args=(args, self.shared, ready), name="EngineCore")
            )
            expect = 1
        for c in self.children:
            c.start()
        got = 0
        while got < expect:
            try:
                ready.get(timeout=0.2)
                got += 1
            except Exception:
                dead = [c for c in self.children if c.exitcode is not None]
                if dead:
                    return self.child_died(dead[0])
        return self.serve()

    def gpu_faults(self) -> None:
        """This run's GPUs start sound, but for what the scenario says is wrong from the start."""
        state = self.args.sim_state
        if not state:
            return
        gpus = {
            r: self.args.base_gpu_id + r - self.args.first_rank
            for r in range(self.args.first_rank, self.args.first_rank + self.args.local_tp)
        }
        for gpu in gpus.values():
            try:
                os.unlink(os.path.join(state, "faults", f"{gpu}.json"))
            except FileNotFoundError:
                pass
        if self.args.sim_remap_rank in gpus:
            fakenvml.fault(
                state,
                gpus[self.args.sim_remap_rank],
                remap_pending=True,
                remap_uncorrected=1,
                ecc_uncorrected=1,
                ecc_aggregate=1,
            )
        if self.args.sim_slowdown_rank in gpus:
            fakenvml.fault(state, gpus[self.args.sim_slowdown_rank], throttle=fakenvml.nvmlClocksEventReasonHwSlowdown)

    def child_died(self, child) -> int:
        rank = child.name.rsplit("TP", 1)[-1] if "TP" in child.name else child.name
        if self.args.engine == "sglang":
            self.log(
                f"Rank {rank} scheduler died during initialization (exit code: {child.exitcode}). "
                f"If your system has limited memory, try --mem-fraction-static."
            )
            self.log("Received sigquit from a child process. It usually means the child failed.")
        else:
            self.log(
                f"Engine core initialization failed. See root cause above. Failed core proc(s): "
                f"{{'EngineCore': {child.exitcode}}}",
                level="ERROR",
                where="core_client.py:741",
            )
        self.stop_children()
        return 1

    def stop_children(self) -> None:
        for c in self.children:
            if c.is_alive():
                c.kill()
        for c in self.children:
            c.join(2)

    def serve(self) -> int:
        args = self.args
        server = ThreadingHTTPServer((args.host, args.port), make_handler(self))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        if args.engine == "sglang":
            self.log.raw(f"INFO:     Started server process [{os.getpid()}]")
            self.log.raw("INFO:     Waiting for application startup.")
            self.log.raw("INFO:     Application startup complete.")
            self.log.raw(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
        else:
            self.log(f"Starting vLLM API server 0 on http://{args.host}:{args.port}", where="api_server.py:1880")
            self.log.raw("INFO:     Application startup complete.")
        self.generate(1, timeout=30)  # the warm-up request
        self.ready = True
        if args.engine == "sglang":
            self.log("The server is fired up and ready to roll!")
        if args.sim_traffic > 0:
            threading.Thread(target=self.traffic, daemon=True).start()
        last = 0
        while True:
            time.sleep(1.0 / self.clock.speed)
            dead = [c for c in self.children if c.exitcode is not None]
            if dead:
                return self.child_died(dead[0])
            gen = self.shared["generated"].value
            if gen != last and args.engine == "sglang":
                rate = (gen - last) * self.clock.speed
                self.log(
                    f"Decode batch. #running-req: 1, #token: {gen}, token usage: 0.01, "
                    f"gen throughput (token/s): {rate:.2f}, #queue-req: 0"
                )
            last = gen

    def traffic(self) -> None:
        while True:
            self.generate(64, timeout=30)
            self.clock.sleep(1.0 / self.args.sim_traffic)

    def generate(self, tokens: int, timeout: float) -> int:
        """Ask the ranks for `tokens` decode steps and wait for them; returns how many came."""
        gen = self.shared["generated"]
        start = gen.value
        with self.shared["pending"].get_lock():
            self.shared["pending"].value += tokens
        deadline = time.monotonic() + timeout
        self.running += 1
        try:
            while gen.value - start < tokens and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            self.running -= 1
        return gen.value - start


def fmt_mmss(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60:02d}:{s % 60:02d}"


def make_handler(server: Server):
    args = server.args

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def reply(self, status: int, body, ctype: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate", "/ping"):
                self.reply(200 if server.ready else 503, "" if server.ready else "starting", "text/plain")
            elif path == "/v1/models":
                self.reply(
                    200,
                    {"object": "list", "data": [{"id": args.model_path, "object": "model", "owned_by": args.engine}]},
                )
            elif path in ("/get_server_info", "/get_model_info"):
                self.reply(
                    200,
                    {
                        "model_path": args.model_path,
                        "tp_size": args.tp_size,
                        "mem_fraction_static": args.mem_fraction,
                        "speculative_algorithm": args.speculative_algorithm,
                        "disable_cuda_graph": args.disable_cuda_graph,
                        "version": "sim",
                    },
                )
            elif path == "/metrics" and (args.enable_metrics or args.engine == "vllm"):
                self.reply(200, server.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self.reply(400, {"error": "invalid JSON"})
            if self.path.split("?")[0] not in ("/v1/completions", "/generate", "/v1/chat/completions"):
                return self.reply(404, {"detail": "Not Found"})
            want = int(req.get("max_tokens") or req.get("sampling_params", {}).get("max_new_tokens") or 16)
            server.prompt_tokens += len(str(req.get("prompt", ""))) // 4 + 1
            got = server.generate(want, timeout=60)
            self.reply(
                200,
                {
                    "object": "text_completion",
                    "model": args.model_path,
                    "choices": [{"index": 0, "text": " tok" * got, "finish_reason": "length"}],
                    "usage": {"completion_tokens": got},
                },
            )

        def log_message(self, fmt, *a):
            if self.path.startswith("/v1/completions"):
                os.write(
                    1,
                    f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.command} {self.path} HTTP/1.1" {a[1]} OK\n'.encode(),
                )

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    server = Server(args)

    def stop(signum, frame):
        server.stop_children()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        return server.start()
    except OSError as exc:
        server.log(f"Error: {exc}", level="ERROR")
        server.stop_children()
        return 1


if __name__ == "__main__":
    sys.exit(main())
