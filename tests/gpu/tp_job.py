"""A real tensor-parallel-shaped job for GPU hosts: one process per GPU, titled like SGLang's
schedulers (`sglang::scheduler_TP<rank>`), a matmul and an NCCL all-reduce per step, and a log in
SGLang's format. `--hang-rank K --hang-after S`: after S seconds rank K stops joining the
all-reduce (it waits elsewhere, in Python) while the other ranks wait in the collective.
`--die-rank K --die-after S`: after S seconds rank K hits a real CUDA error (an out-of-bounds
index on a CUDA tensor: a device-side assert), prints the traceback as SGLang's scheduler does
(`[time TP1] Scheduler hit an exception: Traceback ...`) and exits; the parent never reaps it, so
it stays a zombie while the others hang in the all-reduce.

    python tests/gpu/tp_job.py --log /tmp/tp.log [--gpus N] [--hang-rank 1 --hang-after 20]
    python tests/gpu/tp_job.py --log /tmp/tp.log --die-rank 1 --die-after 15
"""

import argparse
import os
import sys
import time


def say(log, rank, msg):
    log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')} TP{rank}] {msg}\n")
    log.flush()


def odd_rank_waits_elsewhere(log, rank):
    """Where the odd rank sits while the others wait for it in the all-reduce."""
    say(log, rank, "odd rank: leaving the decode loop")
    while True:
        time.sleep(0.05)


def device_side_assert(log, rank):
    """A real CUDA error, as a bad index in a kernel makes one; SGLang's way of reporting it."""
    import traceback

    import torch

    try:
        x = torch.zeros(8, device="cuda")
        bad = torch.tensor([1 << 20], device="cuda")
        x[bad] = 1.0
        torch.cuda.synchronize()
        say(log, rank, "the bad index did not fail: exiting anyway")
    except Exception:
        say(log, rank, "Scheduler hit an exception: " + traceback.format_exc())
    log.flush()
    os._exit(1)


def decode_loop(rank, args, log):
    import torch
    import torch.distributed as dist

    a = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    t = torch.ones(1 << 20, device="cuda")
    start = time.time()
    step = 0
    while True:
        if rank == args.hang_rank and time.time() - start > args.hang_after:
            odd_rank_waits_elsewhere(log, rank)
        if rank == args.die_rank and time.time() - start > args.die_after:
            device_side_assert(log, rank)
        b = a @ a
        t.add_(b[0, :1].float().sum() * 0)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        step += 1
        if step % 200 == 0:
            say(log, rank, f"Decode batch. step {step}, gen throughput (token/s): {step / (time.time() - start):.1f}")


def worker(rank, world, args):
    import torch
    import torch.distributed as dist

    try:
        import setproctitle

        setproctitle.setproctitle(f"sglang::scheduler_TP{rank}")
    except ImportError:
        pass
    torch.cuda.set_device(rank)
    log = open(args.log, "a")
    say(log, rank, "Init torch distributed begin.")
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device(f"cuda:{rank}"))
    say(log, rank, "Init torch distributed ends.")
    say(log, rank, "Load weight begin.")
    weights = torch.empty(int(args.weights_gb * (1 << 30)) // 2, dtype=torch.bfloat16, device="cuda")
    weights.normal_()
    say(log, rank, f"Load weight end. mem usage={args.weights_gb:.2f} GB.")
    if rank == 0:
        log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] The server is fired up and ready to roll!\n")
        log.flush()
    decode_loop(rank, args, log)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=0)
    ap.add_argument("--log", required=True)
    ap.add_argument("--weights-gb", type=float, default=8.0)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-after", type=float, default=1e9)
    ap.add_argument("--die-rank", type=int, default=-1)
    ap.add_argument("--die-after", type=float, default=1e9)
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    world = args.gpus or torch.cuda.device_count()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    if args.die_rank < 0:
        mp.spawn(worker, args=(world, args), nprocs=world, join=True)
        return
    mp.spawn(worker, args=(world, args), nprocs=world, join=False)  # never joined: a dead rank stays a zombie
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
