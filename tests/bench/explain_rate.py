"""`cockpit explain`'s lines per second on a healthy log and on a failure-heavy one, and the
worst-case time of one hostile 64 KiB line per pattern of the log rules.

    python tests/bench/explain_rate.py [--lines 100000 1000000] [--runs 3] [--json OUT]

healthy: a vLLM and an SGLang server's startup (their own phase lines), then serving: access lines,
health probes, the engines' stats lines, in the proportions a busy server prints them.
failures: every crashed log of tests/data/real-logs concatenated, over and over, to N lines (the
shape that made explain grow faster than its log: failures piling up).
Each log is written to a file and read by `explain(read_log(path))`, as `cockpit explain` does.
hostile: tests/data/hostile-lines.py's lines, each classified and fed to a tracker, the slowest
reported (a quadratic pattern over 64 KiB takes seconds; a linear one milliseconds).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cockpit.judge.explain import explain, read_log
from cockpit.read.logrules import LogRules, LogTracker

sys.path.insert(0, str(ROOT / "tests" / "bench"))
from benchlib import report

CORPUS = ROOT / "tests" / "data" / "real-logs"

VLLM_START = [
    "INFO 12-01 10:00:00 [api_server.py:1043] vLLM API server version 0.9.1",
    "INFO 12-01 10:00:01 [core.py:69] Initializing a V1 LLM engine (v0.9.1) with config: model='m'",
    "(VllmWorker rank={r} pid=40{r}) INFO 12-01 10:00:05 [gpu_model_runner.py:1595] Starting to load model m...",
    "(VllmWorker rank={r} pid=40{r}) INFO 12-01 10:00:30 [default_loader.py:272] Loading weights took 24.1 seconds",
    "(VllmWorker rank={r} pid=40{r}) INFO 12-01 10:00:31 [gpu_model_runner.py:1624] Model loading took 15.3 GiB",
    "INFO 12-01 10:00:50 [kv_cache_utils.py:715] GPU KV cache size: 1,234,560 tokens",
    "(VllmWorker rank={r} pid=40{r}) INFO 12-01 10:01:10 [gpu_model_runner.py:2048] Graph capturing finished in 20 secs",
    "INFO 12-01 10:01:11 [core.py:171] init engine (profile, create kv cache, warmup model) took 60.2 seconds",
    "INFO 12-01 10:01:12 [api_server.py:1289] Starting vLLM API server on http://0.0.0.0:8000",
    "INFO:     Application startup complete.",
]
VLLM_SERVE = [
    'INFO:     10.0.{a}.{b}:{p} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:{p} - "GET /health HTTP/1.1" 200 OK',
    "INFO 12-01 11:{m:02d}:{s:02d} [loggers.py:118] Engine 000: Avg prompt throughput: {t}.0 tokens/s, Avg generation "
    "throughput: {g}.4 tokens/s, Running: {a} reqs, Waiting: 0 reqs, GPU KV cache usage: 12.5%, Prefix cache hit "
    "rate: 40.1%",
    "INFO 12-01 11:{m:02d}:{s:02d} [logger.py:43] Received request chatcmpl-{p}: prompt: 'hello', params: "
    "SamplingParams(n=1, temperature=0.7, max_tokens=256), prompt_token_ids: None, lora_request: None.",
    "INFO 12-01 11:{m:02d}:{s:02d} [async_llm.py:261] Added request chatcmpl-{p}.",
]
SGLANG_START = [
    "[2026-12-01 10:00:00] server_args=ServerArgs(model_path='m', tp_size=8, port=30000)",
    "[2026-12-01 10:00:05 TP{r}] Init torch distributed begin.",
    "[2026-12-01 10:00:09 TP{r}] Load weight begin. avail mem=78.50 GB",
    "Loading safetensors checkpoint shards:  50% Completed | 8/16 [00:10<00:10,  1.30s/it]",
    "[2026-12-01 10:00:40 TP{r}] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=60.1 GB",
    "[2026-12-01 10:00:41 TP{r}] KV Cache is allocated. #tokens: 1000000, K size: 20 GB, V size: 20 GB",
    "[2026-12-01 10:00:42 TP{r}] Capture cuda graph begin. This can take up to several minutes. avail mem=19.2 GB",
    "[2026-12-01 10:01:10 TP{r}] Capture cuda graph end. Time elapsed: 28.1 s. mem usage=1.2 GB. avail mem=18.0 GB.",
    "[2026-12-01 10:01:12] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
    "[2026-12-01 10:01:15] The server is fired up and ready to roll!",
]
SGLANG_SERVE = [
    "[2026-12-01 11:{m:02d}:{s:02d} TP0] Prefill batch. #new-seq: 1, #new-token: {t}, #cached-token: 12, token usage: "
    "0.05, #running-req: {a}, #queue-req: 0",
    "[2026-12-01 11:{m:02d}:{s:02d} TP0] Decode batch. #running-req: {a}, #token: 9000, token usage: 0.05, cuda graph: "
    "True, gen throughput (token/s): {g}.21, #queue-req: 0",
    '[2026-12-01 11:{m:02d}:{s:02d}] INFO:     10.0.{a}.{b}:{p} - "POST /generate HTTP/1.1" 200 OK',
    '[2026-12-01 11:{m:02d}:{s:02d}] INFO:     127.0.0.1:{p} - "GET /health HTTP/1.1" 200 OK',
]


def healthy(n: int, engine: str) -> list[str]:
    start, serve = (VLLM_START, VLLM_SERVE) if engine == "vllm" else (SGLANG_START, SGLANG_SERVE)
    out = [line.format(r=r) for line in start for r in (range(8) if "{r}" in line else [0])]
    for i in itertools.count():
        if len(out) >= n:
            break
        out.append(
            serve[i % len(serve)].format(
                a=i % 60, b=i % 250, p=30000 + i % 30000, m=(i // 60) % 60, s=i % 60, t=100 + i % 900, g=200 + i % 800
            )
        )
    return out[:n]


def failures(n: int) -> list[str]:
    crashed = []
    for path in sorted(CORPUS.glob("*.log")):
        lines = path.read_text(encoding="utf-8").splitlines()
        if "verdict=crashed" in lines[1]:
            crashed += lines[2:]
    return list(itertools.islice(itertools.cycle(crashed), n))


def rate(lines: list[str], tmp: Path, name: str, runs: int) -> dict:
    """`runs` reads of the file, one after another: the best (the machine's capability, other
    processes aside) and the median (what a shared 2-core machine gave), in wall time and in the
    process's own CPU time (what the reading cost, whoever else ran on the machine meanwhile)."""
    path = tmp / f"{name}.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    walls, cpus = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        doc = explain(read_log(str(path)))
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    best, median = min(walls), sorted(walls)[len(walls) // 2]
    cpu_best, cpu_median = min(cpus), sorted(cpus)[len(cpus) // 2]
    return {
        "lines": doc["lines"],
        "seconds_best": round(best, 3),
        "seconds_median": round(median, 3),
        "lines_per_s": round(doc["lines"] / best),
        "lines_per_s_median": round(doc["lines"] / median),
        "lines_per_cpu_s": round(doc["lines"] / cpu_best),
        "lines_per_cpu_s_median": round(doc["lines"] / cpu_median),
        "runs": runs,
        "verdict": doc["verdict"]["name"],
        "mib": round(path.stat().st_size / 2**20, 1),
    }


def hostile() -> dict:
    spec = importlib.util.spec_from_file_location("hostile", ROOT / "tests" / "data" / "hostile_lines.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    worst = {}
    for name, line in mod.HOSTILE.items():
        tracker = LogTracker(LogRules("auto"))
        t0 = time.perf_counter()
        tracker.feed(line)
        worst[name] = round((time.perf_counter() - t0) * 1000, 2)
    slowest = max(worst, key=worst.get)
    return {
        "lines": len(worst),
        "slowest": slowest,
        "slowest_ms": worst[slowest],
        "median_ms": sorted(worst.values())[len(worst) // 2],
        "each_ms": worst,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.lines:
            for name, lines in (
                ("healthy_vllm", healthy(n, "vllm")),
                ("healthy_sglang", healthy(n, "sglang")),
                ("failures", failures(n)),
            ):
                r = result[f"{name}_{n}"] = rate(lines, Path(tmp), name, args.runs)
                print(
                    f"{name:>15} {n:>8} lines: {r['lines_per_s']:>8} lines/s best, {r['lines_per_s_median']:>8} "
                    f"median ({r['seconds_best']} s, {r['seconds_median']} s); per CPU second "
                    f"{r['lines_per_cpu_s']} best, {r['lines_per_cpu_s_median']} median",
                    file=sys.stderr,
                    flush=True,
                )
                del lines
    result["hostile"] = hostile()
    report(result, args.json)


if __name__ == "__main__":
    main()
