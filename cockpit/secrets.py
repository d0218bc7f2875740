"""Secrets are masked wherever the cockpit stores or shows something: the ledger, JSON documents,
the screen, kill plans, the relaunch command line. One module, so every place masks alike.

What counts as a secret:
- environment names containing TOKEN, KEY, SECRET, PASSWORD, PASSWD, AUTH or CREDENTIAL, or
  ending in _PAT (a personal access token): the whole value;
- credentials inside a URL (`scheme://user:password@host`, `scheme://token@host`) and secret-named
  query parameters (`?token=…`), in any value or argument;
- command-line values after a flag whose words name a secret: `--api-key X`, `--api-key=X`,
  `--token`, `--hf-token`, `--password`, `--secret`, `--auth-token`, `--access-key`…
  (words, not substrings: `--tokenizer-path` is not a secret).
"""

from __future__ import annotations

import re

MASK = "***"

ENV_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL")
ENV_SUFFIXES = ("_PAT",)
# Names that contain a secret word but hold none (masking them would only hide useful settings).
NOT_SECRET = frozenset({"TOKENIZERS_PARALLELISM"})

FLAG_WORDS = frozenset({"token", "key", "apikey", "secret", "password", "passwd", "pass", "auth", "pat",
                        "credential", "credentials"})

_URL_CRED = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/\s:@]*)(?::(?P<pw>[^/\s@]*))?@")
_QUERY = re.compile(r"(?P<key>[?&;](?:[A-Za-z0-9_.-]*?)(?:token|key|secret|password|passwd|auth|signature|sig)"
                    r"[A-Za-z0-9_.-]*=)(?P<value>[^&;#\s]*)", re.IGNORECASE)
# `NAME=value` inside free text (a shell line, an env listing) where NAME is secret-looking
_ASSIGN = re.compile(r"(?P<name>\b[A-Za-z_][A-Za-z0-9_]*)=(?P<value>\S+)")


def is_secret_name(name: str) -> bool:
    """An environment variable (or any key) whose value is secret."""
    up = str(name).upper()
    if up in NOT_SECRET:
        return False
    return any(w in up for w in ENV_WORDS) or up.endswith(ENV_SUFFIXES) or up == "PAT"


def is_secret_flag(flag: str) -> bool:
    """`--api-key`, `--hf_token`, `-password`: a flag whose value is secret."""
    if not flag.startswith("-"):
        return False
    words = [w for w in re.split(r"[-_.]+", flag.lstrip("-").lower()) if w]
    return any(w in FLAG_WORDS for w in words) or "apikey" in "".join(words)


def mask_url(text: str) -> str:
    """Credentials inside URLs: `postgres://alice:pw@db` -> `postgres://alice:***@db`,
    `https://ghp_x@github.com` -> `https://***@github.com`; secret query values too."""
    if "://" not in text and "=" not in text:
        return text

    def cred(m: re.Match) -> str:
        if m.group("pw") is not None:
            return f"{m.group('scheme')}{m.group('user')}:{MASK}@"
        return f"{m.group('scheme')}{MASK}@"

    text = _URL_CRED.sub(cred, text)
    return _QUERY.sub(lambda m: m.group("key") + MASK, text)


def mask_value(name: str, value):
    """One environment value: all of it when the name is secret, else credentials in URLs."""
    if is_secret_name(name):
        return MASK
    return mask_url(value) if isinstance(value, str) else value


def mask_env(env: dict | None) -> dict:
    return {k: mask_value(k, v) for k, v in (env or {}).items()}


def mask_argv(argv) -> list[str]:
    """An argument list as it may be stored or shown."""
    out: list[str] = []
    hide_next = False
    for arg in list(argv or []):
        arg = str(arg)
        if hide_next and not arg.startswith("-"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        if arg.startswith("-") and "=" in arg:
            flag, _, value = arg.partition("=")
            out.append(f"{flag}={MASK}" if is_secret_flag(flag) else f"{flag}={mask_url(value)}")
            continue
        if is_secret_flag(arg):
            hide_next = True
            out.append(arg)
            continue
        if "=" in arg and not arg.startswith("-"):
            name, _, value = arg.partition("=")
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and is_secret_name(name):
                out.append(f"{name}={MASK}")  # `env HF_TOKEN=x python …`
                continue
        out.append(mask_url(arg))
    return out


def mask_text(text: str) -> str:
    """A free line of text (a joined command line, a log line shown in a plan)."""
    text = mask_url(str(text))
    words = text.split(" ")
    masked = mask_argv(words)
    text = " ".join(masked)
    return _ASSIGN.sub(lambda m: f"{m.group('name')}={MASK}" if is_secret_name(m.group("name")) else m.group(0), text)


def mask_record(record):
    """A ledger record or JSON document: `env` dicts, `argv` lists, and keys whose words name a
    secret anywhere (`api_key`, `hf_token`; not `tokenizer_path`)."""
    if isinstance(record, dict):
        out = {}
        for k, v in record.items():
            if k == "env" and isinstance(v, dict):
                out[k] = mask_env(v)
            elif k in ("argv", "cmdline") and isinstance(v, list):
                out[k] = mask_argv(v)
            elif isinstance(k, str) and is_secret_flag("--" + k) and isinstance(v, (str, int, float)):
                out[k] = MASK
            else:
                out[k] = mask_record(v)
        return out
    if isinstance(record, list):
        return [mask_record(v) for v in record]
    if isinstance(record, str):
        return mask_url(record)
    return record
