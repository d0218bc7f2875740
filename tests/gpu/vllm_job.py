"""A real vLLM-shaped TP-2 serving job for a GPU host with one GPU: two worker processes titled as
vLLM V1 titles them (`VLLM::Worker_TP<rank>`), each a bf16 matmul on cuda:0 and a gloo all-reduce
per decode step (several ranks share GPU 0: NCCL needs a GPU per rank), an API server process
(`... serve`) answering /health and /metrics with vLLM's metric names, and one log in vLLM's
format: the workers' and the API server's startup lines, then the API server's periodic stats
line every 10 s (VLLM_LOG_STATS_INTERVAL) with vLLM's own rule (loggers.py: a line whose
throughput and the last one's are both zero goes to debug, so a stall shows one zero line and
then silence). Eight requests run all the time.

`--hang-rank K --hang-after S`: after S seconds of serving rank K stops calling the collective (it
waits elsewhere, in Python); the other rank waits in the all-reduce; /health keeps answering
200, the token counter freezes while 8 requests run.

`--capture-hang-rank K`: rank K stops while the ranks capture CUDA graphs, before the API server
opens its port; the other waits in the capture's all-reduce. The API server holds the ranks'
rendezvous store (torch's TCPStore) on MASTER_PORT from the start, as a real launch listens on
ports of its own long before it serves.

    python tests/gpu/vllm_job.py serve --log /tmp/vllm.log --port 8011 [--hang-rank 1 --hang-after 40]
"""

import argparse
import http.server
import os
import sys
import threading
import time

RUNNING = 8


def line(log, who, msg, level="INFO", where="loggers.py:123"):
    log.write(f"({who} pid={os.getpid()}) {level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {msg}\n")
    log.flush()


def odd_rank_waits_elsewhere(rank, marker):
    """Where the odd rank sits while the other waits for it in the all-reduce (the moment it left
    goes to a side file, never to the server's log, for the run's report)."""
    if marker.startswith("/dev/"):  # the log is the launch's own stdout: the side file goes to /tmp
        marker = f"/tmp/vllm_job-{os.getppid()}.hang-at"
    with open(marker, "w") as fh:
        fh.write(f"{time.time():.3f}\n")
    while True:
        time.sleep(0.05)


def worker(rank, world, args, tokens, ready):
    import setproctitle
    import torch
    import torch.distributed as dist

    setproctitle.setproctitle(f"VLLM::Worker_TP{rank}")
    log = open(args.log, "a")
    who = f"Worker_TP{rank}"
    torch.cuda.set_device(0)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False)
    dist.init_process_group("gloo", rank=rank, world_size=world, store=store)
    line(log, who, "Starting to load model /models/tiny...", where="gpu_model_runner.py:1770")
    weights = torch.empty(int(args.weights_gb * (1 << 30)) // 2, dtype=torch.bfloat16, device="cuda")
    weights.normal_()
    line(log, who, f"Model loading took {args.weights_gb:.4f} GiB and 1.02 seconds", where="gpu_model_runner.py:1802")
    line(log, who, "Available KV cache memory: 20.00 GiB", where="gpu_worker.py:240")
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    for step in range(1, 4):  # vLLM captures its CUDA graphs batch size by batch size, a collective in each
        if rank == 0:
            log.write(f"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): {step * 33}%|###| {step}/3\n")
            log.flush()
        if rank == args.capture_hang_rank:
            odd_rank_waits_elsewhere(rank, args.log + ".hang-at")
        t = (a @ a)[0, :8].float().cpu()
        dist.all_reduce(t)
    line(log, who, "Graph capturing finished in 2 secs, took 0.10 GiB", where="gpu_model_runner.py:2650")
    start = None
    while True:
        if ready.is_set() and start is None:
            start = time.time()
        if rank == args.hang_rank and start is not None and time.time() - start > args.hang_after:
            odd_rank_waits_elsewhere(rank, args.log + ".hang-at")
        b = a @ a
        t = b[0, :8].float().cpu()
        dist.all_reduce(t)  # gloo: the rank left waits here
        torch.cuda.synchronize()
        if rank == 0:
            with tokens.get_lock():
                tokens.value += RUNNING
        ready.set()


class Metrics(http.server.BaseHTTPRequestHandler):
    tokens = None

    def do_GET(self):
        if self.path.startswith("/health"):
            body, ctype = b"", "text/plain"
        elif self.path.startswith("/metrics"):
            g = self.tokens.value
            body = (
                f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine="0"}} {RUNNING}\n'
                f'vllm:num_requests_waiting{{engine="0"}} 0\nvllm:kv_cache_usage_perc{{engine="0"}} 0.031\n'
                f"# TYPE vllm:generation_tokens_total counter\n"
                f'vllm:generation_tokens_total{{engine="0"}} {float(g)}\n'
            ).encode()
            ctype = "text/plain; version=0.0.4"
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *a):  # uvicorn's access line
        with open(self.server.log_path, "a") as log:
            log.write(
                f"(APIServer pid={os.getpid()}) INFO:     {self.client_address[0]}:{self.client_address[1]} - "
                f'"{self.command} {self.path} HTTP/1.1" {a[1]} OK\n'
            )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["serve"])
    ap.add_argument("--log", required=True)
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--weights-gb", type=float, default=2.0)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-after", type=float, default=1e9)
    ap.add_argument("--capture-hang-rank", type=int, default=-1)
    # options a real server takes that change nothing here: a bisect's harmless flag sets
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--disable-log-requests", action="store_true")
    args = ap.parse_args()
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    log = open(args.log, "a")
    line(log, "APIServer", "vLLM API server version 0.10.1.1", where="api_server.py:1805")
    line(
        log,
        "APIServer",
        f"non-default args: {{'model': '/models/tiny', 'port': {args.port}, 'tensor_parallel_size': 2}}",
        where="utils.py:326",
    )
    import torch.distributed as dist

    _store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 2, is_master=True, wait_for_workers=False
    )  # the rendezvous, held here from the start
    ctx = mp.get_context("spawn")
    tokens, ready = ctx.Value("q", 0), ctx.Event()
    procs = [ctx.Process(target=worker, args=(r, 2, args, tokens, ready), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    ready.wait()
    line(
        log,
        "EngineCore_0",
        "init engine (profile, create kv cache, warmup model) took 3.10 seconds",
        where="core.py:210",
    )
    Metrics.tokens = tokens
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Metrics)
    server.log_path = args.log
    threading.Thread(target=server.serve_forever, daemon=True).start()
    line(log, "APIServer", f"Starting vLLM API server 0 on http://127.0.0.1:{args.port}", where="launcher.py:29")
    log.write(f"(APIServer pid={os.getpid()}) INFO:     Application startup complete.\n")
    log.flush()
    last_g, last_rate, last_t = tokens.value, None, time.time()
    while all(p.is_alive() for p in procs):
        time.sleep(10)
        now, g = time.time(), tokens.value
        rate = (g - last_g) / (now - last_t)
        if rate or last_rate:  # vLLM's loggers.py: both zero goes to debug ("avoid log noise")
            line(
                log,
                "APIServer",
                f"Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
                f"{rate:.1f} tokens/s, Running: {RUNNING} reqs, Waiting: 0 reqs, GPU KV cache "
                f"usage: 3.1%, Prefix cache hit rate: 0.0%",
            )
        last_g, last_rate, last_t = g, rate, now
    return 1


if __name__ == "__main__":
    sys.exit(main())
