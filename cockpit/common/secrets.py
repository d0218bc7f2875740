"""Secrets are masked wherever the cockpit stores or shows something: the ledger, JSON documents,
the screen, kill plans, the relaunch command line. One module, so every place masks alike.

What counts as a secret:
- environment names containing TOKEN, KEY, SECRET, PASSWORD, PASSWD, AUTH or CREDENTIAL, or
  ending in _PAT (a personal access token): the whole value;
- credentials inside a URL (`scheme://user:password@host`, `scheme://token@host`; a password
  with `/` or `@` in it masked whole) and secret-named query parameters (`?token=…`), in any
  value or argument;
- command-line values after a flag whose words name a secret: `--api-key X`, `--api-key=X`,
  `--token`, `--hf-token`, `--password`, `--secret`, `--auth-token`, `--access-key`…
  (words, not substrings: `--tokenizer-path` is not a secret);
- in a log line (`mask_line`), also the engines' own shapes: `key=value`, `key='value'` and
  `'key': 'value'` pairs whose key's last word names a secret (SGLang's `ServerArgs(api_key=…)`,
  vLLM's `non-default args: {'hf_token': …}`), `Bearer …` tokens, and tokens known by their prefix
  (`sk-…`, `hf_…`, `ghp_…`).

Every pattern here runs in linear time (no two quantifiers compete for the same characters; each
start position fails within a bounded number of steps or consumes what it scanned), and texts are
cut at MAX_TEXT first: a hostile process title or log line cannot make masking slow.
"""

from __future__ import annotations

import re

MASK = "***"

ENV_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL")
ENV_SUFFIXES = ("_PAT",)
# Names that contain a secret word but hold none (masking them would only hide useful settings).
NOT_SECRET = frozenset({"TOKENIZERS_PARALLELISM"})

FLAG_WORDS = frozenset(
    {"token", "key", "apikey", "secret", "password", "passwd", "pass", "auth", "pat", "credential", "credentials"}
)

MAX_TEXT = 1 << 20  # longer texts are cut before they are masked (a title, a line: never this long)

# `://user:pw@`: found from the `://` itself (a scheme before it needs no scan: scanning one back
# from every letter of a long run was quadratic); the URL runs to the first of these
_SEP = re.compile(r"://")
_URL_END = re.compile(r"[\s'\"<>]")
_QUERY = re.compile(r"(?P<key>[?&;](?P<name>[A-Za-z0-9_.-]+)=)(?P<value>[^&;#\s]*)")
_QUERY_WORDS = ("token", "key", "secret", "password", "passwd", "auth", "signature", "sig")
# what a log line holds (mask_line)
LINE_WORDS = frozenset(
    {
        "token",
        "key",
        "apikey",
        "secret",
        "password",
        "passwd",
        "pat",
        "auth",
        "authorization",
        "credential",
        "credentials",
    }
)
_BEARER = re.compile(
    r"(?i)(?P<kind>\bbearer|\bauthorization['\"]?\s{0,3}[:=]\s{0,3}['\"]?(?:basic|bearer|token|digest)?)"
    r"(?P<gap>\s*)[A-Za-z0-9._~+/=-]{8,}"
)
_PREFIXED = re.compile(
    r"(?<![A-Za-z0-9])(?:sk-[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,})"
)
_FLAG = re.compile(r"(?<!\S)(?P<flag>--?[A-Za-z][A-Za-z0-9_.-]{0,63})(?P<sep>=|\s+)(?P<value>[^\s-]\S*)")
_PAIR = re.compile(
    r"(?<![\w.-])(?P<q>['\"]?)(?P<key>[A-Za-z_][A-Za-z0-9_.-]{0,63})(?P=q)(?P<sep>\s{0,3}[=:]\s{0,3})"
    r"(?P<value>\[[^\]\n]{0,4096}\]|'[^'\n]{0,4096}'|\"[^\"\n]{0,4096}\"|[^\s,;)}\]'\"]{1,4096})"
)
_COUNT = re.compile(r"[0-9][0-9.,]{0,30}[kKMG]?")
_DONE = re.compile(r"(?i)['\"]?(?:(?:bearer|basic|token|digest)\s+)?\*\*\*['\"]?")  # masked already
_UNSET = frozenset({"none", "null", "false", "true", "''", '""', "[]", "bearer", "basic", "token", "digest"})
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

    def query(m: re.Match) -> str:
        name = m.group("name").lower()
        return m.group("key") + MASK if any(w in name for w in _QUERY_WORDS) else m.group(0)

    text = _mask_userinfo(text[:MAX_TEXT])
    return _QUERY.sub(query, text)


def _mask_userinfo(text: str) -> str:
    """Each URL's userinfo masked, the password's every character: `user:` followed by anything
    up to the URL's last `@` (a password may hold `/` and `@` unencoded: `u:p/a@ss@host`); without
    a `user:` before the first `/`, the userinfo ends at the last `@` before that `/`. A port
    followed by a path with an `@` in it is masked too (`host:***@x`): rather that than a
    password shown. Linear: each URL's end and last `@` are found once, the searches after a
    `://` stop at the next one (its `/`) or at what was masked."""
    out: list[str] = []
    done, end, last_at = 0, -1, -1
    for m in _SEP.finditer(text):
        start = m.end()
        if start < done:
            continue
        if start > end:  # another URL: where it ends and its last `@`, once
            stop = _URL_END.search(text, start)
            end = stop.start() if stop else len(text)
            last_at = text.rfind("@", start, end)
        if last_at < start:
            continue
        at = last_at
        slash = text.find("/", start, at)
        colon = text.find(":", start, at if slash < 0 else slash)
        if slash >= 0 and colon < 0:
            at = text.rfind("@", start, slash)
            if at < 0:
                continue
            colon = text.find(":", start, at)
        user = colon >= 0 and text.find("@", start, colon) < 0
        out.append(text[done : colon + 1] if user else text[done:start])
        out.append(MASK)
        done = at
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


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
        arg = _PREFIXED.sub(MASK, str(arg)[:MAX_TEXT])
        if hide_next and not arg.startswith("-"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        if " " in arg.strip():  # a title set with setproctitle: a whole command line in one argument
            out.append(mask_text(arg))
            continue
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
    text = mask_url(str(text)[:MAX_TEXT])
    words = text.split(" ")
    masked = mask_argv(words)
    text = " ".join(masked)
    return _ASSIGN.sub(lambda m: f"{m.group('name')}={MASK}" if is_secret_name(m.group("name")) else m.group(0), text)


def is_secret_key(key: str) -> bool:
    """A key in a log line's `key=value` or `'key': value` whose last word names a secret
    (`api_key`, `hf_token`, `HF_TOKEN`, `client_secret`; not `num_key_value_heads`)."""
    words = [w for w in re.split(r"[-_.]+", key.lower()) if w]
    return bool(words) and (words[-1] in LINE_WORDS or words[-1].endswith("apikey"))


def mask_line(text: str) -> str:
    """A line of host text as it may be shown or stored (a log line, a py-spy header, a line of
    a bundle member): URL credentials, secret flags' values, the engines' secret pairs, bearer
    tokens and prefixed tokens masked; anything else left as it is."""
    text = str(text)[:MAX_TEXT]
    if not text:
        return text
    text = _BEARER.sub(lambda m: m.group("kind") + m.group("gap") + MASK, text)
    text = _PREFIXED.sub(MASK, text)
    text = mask_url(text)

    def flag(m: re.Match) -> str:
        return m.group("flag") + m.group("sep") + MASK if is_secret_flag(m.group("flag")) else m.group(0)

    def pair(m: re.Match) -> str:
        value = m.group("value")
        if not is_secret_key(m.group("key")) or value.lower() in _UNSET or _DONE.fullmatch(value):
            return m.group(0)
        if _COUNT.fullmatch(value) and m.group("key").lower().endswith("token"):
            return m.group(0)  # a count of tokens: SGLang's `#token: 49`
        quote = value[0] if value[0] in "'\"" else ""
        return m.group("q") + m.group("key") + m.group("q") + m.group("sep") + quote + MASK + quote

    text = _FLAG.sub(flag, text)
    return _PAIR.sub(pair, text)


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
