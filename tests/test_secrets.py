"""Secrets masked wherever they are stored or shown: one module, tested on its own here and
through the ledger, JSON and the screen in tests/test_safety.py."""

import pytest

from cockpit.secrets import MASK, is_secret_flag, is_secret_name, mask_argv, mask_env, mask_record, mask_text, mask_url


@pytest.mark.parametrize("name", ["HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "MYSQL_PASSWD",
                                  "BASIC_AUTH", "AUTHORIZATION", "GITHUB_PAT", "GOOGLE_APPLICATION_CREDENTIALS",
                                  "hf_token", "WANDB_API_KEY"])
def test_secret_env_names(name):
    assert is_secret_name(name)
    assert mask_env({name: "v"}) == {name: MASK}


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "PATH", "TOKENIZERS_PARALLELISM", "PATCH_LEVEL"])
def test_plain_env_names(name):
    assert not is_secret_name(name)
    assert mask_env({name: "v"}) == {name: "v"}


def test_credentials_inside_urls_in_any_value():
    env = mask_env({"DATABASE_URL": "postgres://alice:s3cret@db.internal:5432/app",
                    "HF_ENDPOINT": "https://hf_abcdef@huggingface.co/x", "PLAIN": "https://example.com/a?b=1",
                    "WEBHOOK": "https://h.example/hook?token=abc123&x=1"})
    assert env["DATABASE_URL"] == "postgres://alice:***@db.internal:5432/app"
    assert env["HF_ENDPOINT"] == "https://***@huggingface.co/x"
    assert env["PLAIN"] == "https://example.com/a?b=1"
    assert env["WEBHOOK"] == "https://h.example/hook?token=***&x=1"
    assert "s3cret" not in mask_url("redis://:s3cret@localhost:6379/0")


def test_argv_values_after_secret_flags_both_forms():
    argv = ["python", "-m", "sglang.launch_server", "--api-key", "sk-live-1", "--hf-token=hf_2", "--token", "t3",
            "--password", "p4", "--tokenizer-path", "/models/tok", "--ssl-keyfile", "/k.pem", "--port", "30000",
            "--admin-api-key=sk-5", "--auth-token", "a6", "--disable-cuda-graph", "--model", "https://u:p7@h/m",
            "env", "GITHUB_PAT=ghp_8"]
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
    rec = mask_record({"argv": ["--api-key", "k"], "env": {"HF_TOKEN": "x"},
                       "params": {"api_key": "y", "tp": 8, "tokenizer_path": "/t"}, "evidence": ["postgres://a:b@h/db down"]})
    assert rec == {"argv": ["--api-key", MASK], "env": {"HF_TOKEN": MASK},
                   "params": {"api_key": MASK, "tp": 8, "tokenizer_path": "/t"}, "evidence": ["postgres://a:***@h/db down"]}
