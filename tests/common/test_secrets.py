"""Secrets masked wherever they are stored or shown: one module, tested on its own here and
through the ledger, JSON and the screen in tests/actions/test_safety.py."""

import time

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings, strategies as st

from cockpit.common.secrets import (
    MASK,
    MAX_TEXT,
    is_secret_flag,
    is_secret_name,
    mask_argv,
    mask_env,
    mask_line,
    mask_record,
    mask_text,
    mask_url,
)


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "MYSQL_PASSWD",
        "BASIC_AUTH",
        "AUTHORIZATION",
        "GITHUB_PAT",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "hf_token",
        "WANDB_API_KEY",
    ],
)
def test_secret_env_names(name):
    assert is_secret_name(name)
    assert mask_env({name: "v"}) == {name: MASK}


@pytest.mark.parametrize(
    "name", ["NCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "PATH", "TOKENIZERS_PARALLELISM", "PATCH_LEVEL"]
)
def test_plain_env_names(name):
    assert not is_secret_name(name)
    assert mask_env({name: "v"}) == {name: "v"}


def test_credentials_inside_urls_in_any_value():
    env = mask_env(
        {
            "DATABASE_URL": "postgres://alice:s3cret@db.internal:5432/app",
            "HF_ENDPOINT": "https://hf_abcdef@huggingface.co/x",
            "PLAIN": "https://example.com/a?b=1",
            "WEBHOOK": "https://h.example/hook?token=abc123&x=1",
        }
    )
    assert env["DATABASE_URL"] == "postgres://alice:***@db.internal:5432/app"
    assert env["HF_ENDPOINT"] == "https://***@huggingface.co/x"
    assert env["PLAIN"] == "https://example.com/a?b=1"
    assert env["WEBHOOK"] == "https://h.example/hook?token=***&x=1"
    assert "s3cret" not in mask_url("redis://:s3cret@localhost:6379/0")


def test_argv_values_after_secret_flags_both_forms():
    argv = [
        "python",
        "-m",
        "sglang.launch_server",
        "--api-key",
        "sk-live-1",
        "--hf-token=hf_2",
        "--token",
        "t3",
        "--password",
        "p4",
        "--tokenizer-path",
        "/models/tok",
        "--ssl-keyfile",
        "/k.pem",
        "--port",
        "30000",
        "--admin-api-key=sk-5",
        "--auth-token",
        "a6",
        "--disable-cuda-graph",
        "--model",
        "https://u:p7@h/m",
        "env",
        "GITHUB_PAT=ghp_8",
    ]
    out = mask_argv(argv)
    joined = " ".join(out)
    for secret in ("sk-live-1", "hf_2", "t3", "p4", "sk-5", "a6", "p7", "ghp_8"):
        assert secret not in joined, secret
    assert out[out.index("--api-key") + 1] == MASK and "--hf-token=***" in out and "--admin-api-key=***" in out
    assert "/models/tok" in out and "/k.pem" in out and "30000" in out  # not secrets: left as they are
    assert "https://u:***@h/m" in out and "GITHUB_PAT=***" in out


def test_a_secret_flag_without_a_value_hides_nothing_else():
    assert mask_argv(["--api-key", "--port", "1"]) == ["--api-key", "--port", "1"]
    assert is_secret_flag("--api_key") and is_secret_flag("--apikey") and not is_secret_flag("--tokenizer-mode")


def test_text_and_records():
    assert "sk-9" not in mask_text("python -m x --api-key sk-9 --port 1")
    assert "HF_TOKEN=***" in mask_text("HF_TOKEN=hf_x python serve")
    rec = mask_record(
        {
            "argv": ["--api-key", "k"],
            "env": {"HF_TOKEN": "x"},
            "params": {"api_key": "y", "tp": 8, "tokenizer_path": "/t"},
            "evidence": ["postgres://a:b@h/db down"],
        }
    )
    assert rec == {
        "argv": ["--api-key", MASK],
        "env": {"HF_TOKEN": MASK},
        "params": {"api_key": MASK, "tp": 8, "tokenizer_path": "/t"},
        "evidence": ["postgres://a:***@h/db down"],
    }


# ----------------------------------------------------------------------------- log lines (issue 25)

LOG_CORPUS = [
    # SGLang's server_args line
    (
        "[2026-01-01 10:00:00] server_args=ServerArgs(model_path='/m/llama', api_key='sk-abcdefghij0123456789', "
        "hf_token='hf_abcdefghijklmnopqrst', num_key_value_heads=8, tokenizer_path='/m/tok', admin_api_key='adm-1')",
        ["sk-abcdefghij0123456789", "hf_abcdefghijklmnopqrst", "adm-1"],
        ["num_key_value_heads=8", "tokenizer_path='/m/tok'"],
    ),
    # vLLM's non-default args dict repr
    (
        "INFO 01-01 10:00:00 [api_server.py:1] non-default args: {'model': '/m', 'api_key': ['key-one', 'key-two'], "
        "'hf_token': 'plain-tok-x', 'max_num_batched_tokens': 8192, \"token\": \"dq\"}",
        ["key-one", "key-two", "plain-tok-x", "'dq'", '"dq"'],
        ["'max_num_batched_tokens': 8192", "'model': '/m'"],
    ),
    (
        "connecting to postgres://alice:pw-1@db:5432/x and redis://:pw-2@cache:6379 and https://ghtok@github.com/a",
        ["pw-1", "pw-2", "ghtok"],
        ["postgres://alice:***@db:5432/x"],
    ),
    (
        "headers={'Authorization': 'Bearer abcdefgh12345678'} curl -H \"Authorization: Basic dXNlcjpwYXNzd29yZA==\"",
        ["abcdefgh12345678", "dXNlcjpwYXNzd29yZA=="],
        ["Bearer ***"],
    ),
    (
        "env HF_TOKEN=hf_x1 OPENAI_API_KEY=k2 python -m vllm serve --api-key k3 --hf-token=k4 password: k5 secret=k6",
        ["hf_x1", "=k2", "k3", "k4", "k5", "k6"],
        ["--api-key ***", "python -m vllm serve"],
    ),
    (
        "a stray token sk-proj-abcdefghijklmnop1234 and hf_ABCDEFGHIJKLMNOPQRSTUV in text",
        ["sk-proj-abcdefghijklmnop1234", "hf_ABCDEFGHIJKLMNOPQRSTUV"],
        ["a stray token"],
    ),
    (
        "[2026-11-30 09:50:38] Decode batch. #running-req: 1, #token: 49, token usage: 0.01, gen throughput (token/s): 49.00",
        [],
        ["#token: 49,", "token usage: 0.01"],
    ),
    ("api_key=None hf_token=None token: null", [], ["api_key=None", "hf_token=None", "token: null"]),
    (
        "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=12.3 GB, tokenizer_mode='auto'",
        [],
        ["tokenizer_mode='auto'", "dtype=torch.bfloat16"],
    ),
]


@pytest.mark.parametrize("line,hidden,kept", LOG_CORPUS)
def test_log_lines_of_the_engines_are_masked(line, hidden, kept):
    out = mask_line(line)
    for secret in hidden:
        assert secret not in out, (secret, out)
    for text in kept:
        assert text in out, (text, out)


def test_a_setproctitle_title_is_masked_as_a_command_line():
    out = mask_argv(["python3 -m sglang.launch_server --api-key sk-abcdefghij0123456789 --port 1", "-x"])
    assert "sk-abcdefghij" not in " ".join(out) and "--port 1" in out[0]
    assert mask_argv(["--api-key", "two words", "--prompt", "hello world"]) == [
        "--api-key",
        MASK,
        "--prompt",
        "hello world",
    ]


# Masking time: hostile titles and lines (a long run of one character, then `://`, issue 25) must
# cost time linear in their length. Measured in CPU time (process_time), bounded 50 times above
# what the slowest shape costs here (under 0.2 s for 256 KiB), so a loaded machine cannot flake it;
# the quadratic patterns this replaces took minutes on such inputs.
ALPHABET = "a:/@?&;=-_' \"[]{}(),.tkesbBhf0"
SIZE = 256 << 10


@settings(
    max_examples=25, deadline=None, phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck)
)
@example(unit="a", tail="://")
@example(unit="token", tail="=")
@example(unit="sk-", tail="")
@example(unit="a:'", tail="")
@example(unit="-a ", tail="x")
@given(unit=st.text(alphabet=ALPHABET, min_size=1, max_size=12), tail=st.text(alphabet=ALPHABET, max_size=6))
def test_masking_costs_time_linear_in_the_input(unit, tail):
    text = (unit * (SIZE // len(unit) + 1))[:SIZE] + tail
    start = time.process_time()
    mask_line(text)
    mask_text(text)
    mask_argv([text, "--api-key", text])
    mask_record({"env": {"X": text}, "evidence": [text]})
    assert time.process_time() - start < 10.0


def test_inputs_are_cut_before_they_are_masked():
    assert len(mask_line("a" * (4 << 20))) == MAX_TEXT and len(mask_text("a" * (4 << 20))) == MAX_TEXT
