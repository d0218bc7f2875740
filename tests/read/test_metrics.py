"""The engine's metrics: the Prometheus parser on SGLang's documented example and vLLM-shaped
text, hostile lines, the frozen-tokens judgement with /health still answering, and the simulated
server's metrics scraped through the real agent while a rank hangs (counters frozen, requests
running)."""

from __future__ import annotations

import asyncio
import math

from conftest import free_port
from simhost import SimRun, wait_for

from cockpit.host.state import HostState
from cockpit.judge.evidence import merge
from cockpit.judge.verdict import Verdict, VerdictName
from cockpit.read import metrics

# From SGLang's documentation (docs.sglang.io, "Production Metrics"), as its server prints it.
SGLANG_DOC = """# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.557572e+06
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.3518979474117756e+06
sglang:time_to_first_token_seconds_bucket{le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
"""

VLLM = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0 1764516932000
"""


def test_sglang_documented_example_parses_whole():
    samples, bad = metrics.parse(SGLANG_DOC)
    assert bad == 0 and len(samples) == 6
    assert metrics.family_value(samples, metrics.families()["generation_tokens"]) == 7557572.0
    assert metrics.family_value(samples, metrics.families()["kv_usage"]) == 0.28
    inf = [s for s in samples if s.labels.get("le") == "+Inf"]
    assert inf and inf[0].value == 1.0


def test_vllm_series_of_several_engines_add_up_and_timestamps_are_allowed():
    samples, bad = metrics.parse(VLLM)
    assert bad == 0
    assert metrics.family_value(samples, metrics.families()["running"]) == 5.0
    assert metrics.family_value(samples, metrics.families()["waiting"]) == 7.0
    assert metrics.family_value(samples, metrics.families()["generation_tokens"]) == 1000.0


def test_per_tp_rank_series_count_once_and_escapes_and_hostile_lines():
    text = (
        'sglang:generation_tokens_total{tp_rank="1",model_name="a\\"b"} 50\n'
        'sglang:generation_tokens_total{tp_rank="0",model_name="a\\"b"} 50\n'
        'sglang:num_running_reqs{model_name="[bold red]x[/]\\n",} NaN\n'
        'sglang:num_queue_reqs{model_name="unterminated} 3\n'
        "{} 5\nsglang:token_usage 0.5 1 2\nsglang:token_usage abc\n" + "x" * 100_000 + "{\n"
    )
    samples, bad = metrics.parse(text)
    assert bad == 5
    assert metrics.family_value(samples, metrics.families()["generation_tokens"]) == 50.0  # tp rank 0's only
    assert samples[0].labels["model_name"] == 'a"b'
    running = [s for s in samples if s.name == "sglang:num_running_reqs"][0]
    assert math.isnan(running.value) and running.labels["model_name"] == "[bold red]x[/]\n"  # data, not markup
    assert metrics.family_value(samples, metrics.families()["running"]) is None  # NaN is no number


def scrape(at, gen, running, status=200):
    body = f"sglang:generation_tokens_total {gen}\nsglang:num_running_reqs {running}\nsglang:token_usage 0.1\n"
    return metrics.scrape_of({"status": status, "body": body}, at=at)


def test_tokens_frozen_while_requests_run_is_a_stall_that_health_hides():
    view = metrics.MetricsView()
    view.add(scrape(0.0, 100, 1))
    view.add(scrape(2.0, 140, 1))
    assert view.tokens_per_s() == 20.0 and view.frozen_since is None
    view.add(scrape(4.0, 140, 1))
    view.add(scrape(20.0, 140, 1))
    assert view.frozen_for(20.0) == 18.0
    assert metrics.findings(view, 20.0, 30) == []
    view.health = {"status": 200, "ms": 1.0}
    [f] = metrics.findings(view, 40.0, 30)
    assert f.stalled and f.evidence[0] == "1 request running, generation tokens frozen at 140 for 38 s"
    assert "still answers /health (200)" in f.evidence[1]
    state = HostState("h")
    v = merge(Verdict(VerdictName.OK, []), [f], state)
    assert v.name == VerdictName.STALLED_IDLE and v.evidence[0].startswith("metrics: 1 request running")
    assert metrics.describe(view) == "0 tok/s run 1 KV 10%"
    view.add(scrape(41.0, 140, 0))  # nothing running: frozen tokens are just an idle server
    assert view.frozen_since is None and metrics.findings(view, 80.0, 30) == []


def test_metrics_off_is_said_and_asked_again_later_only():
    view = metrics.MetricsView()
    s = metrics.scrape_of({"status": 404, "body": "{}"}, at=10.0)
    view.add(s)
    assert "--enable-metrics" in s.error and not view.due(11.0) and view.due(10.0 + metrics.BACKOFF_S)
    assert view.header() == {"error": s.error} and metrics.describe(view) == ""
    assert metrics.scrape_of({"status": None, "error": "Connection refused"}).error == "Connection refused"


async def test_the_simulated_hang_freezes_tokens_while_requests_run(sim_state, tmp_path):
    port = free_port()
    async with SimRun(
        sim_state, tmp_path, port, ["--sim-hang-rank", "3", "--sim-traffic", "4", "--enable-metrics"]
    ) as run:
        await wait_for(lambda: "ready to roll" in run.log_text(), 40, "ready")
        view = metrics.MetricsView()
        first = await run.session.request("metrics", port=port, want=metrics.wanted())
        assert first["status"] == 200 and "sglang:num_running_reqs" in first["body"] and "# HELP" in first["body"]
        view.add(metrics.scrape_of(first))
        for _ in range(40):
            await asyncio.sleep(0.5)
            view.add(metrics.scrape_of(await run.session.request("metrics", port=port, want=metrics.wanted())))
            if view.frozen_for(view.scrapes[-1].at) > 3:
                break
        h = view.header()
        assert h["running"] >= 1 and view.frozen_for(view.scrapes[-1].at) > 3
        assert 0 < h["kv_usage"] < 1
        full = await run.session.request("metrics", port=port)
        assert "sglang:prompt_tokens_total" in full["body"]  # unfiltered: the bundle's scrape
