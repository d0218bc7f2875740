"""`cockpit serve`: the cockpit in a browser, through textual-serve, guarded.

textual-serve alone answers any page that asks: a script on any web site the operator visits could
open its WebSocket to 127.0.0.1, read the screen and press `K`, `y`. Here:

- a fresh random token per start (`secrets.token_urlsafe`) is required on the page (`/?token=T`)
  and on the WebSocket (`/ws/T`, the path the page is given); the printed URL carries it;
- the WebSocket's Origin must be the page's own (`http://HOST:PORT` the browser asked for), and
  when bound to loopback the Host must be a loopback name (a DNS-rebound name is refused);
- every refusal is HTTP 403 with one line saying why; the page is not framed by other sites and
  sends no Referer;
- the served cockpit is `--read-only` unless `--allow-actions`.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import secrets
import shlex
import socket
import sys

from cockpit.common.errors import CockpitError

TOKEN_BYTES = 24


def is_loopback(host: str | None) -> bool:
    """`localhost` or a loopback IP literal (127.0.0.0/8, ::1), read by ipaddress: a name that
    merely starts like one (`127.evil.example`, a DNS-rebound page) is not."""
    host = (host or "").strip().strip("[]").lower()
    if host.rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HideToken(logging.Filter):
    """Every log record (aiohttp's access log prints each request line, `/?token=…`, `/ws/…`)
    with the token replaced: only the URL printed at start carries it."""

    def __init__(self, token: str):
        super().__init__()
        self.token = token

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if self.token in text:
            record.msg, record.args = text.replace(self.token, "***"), ()
        return True


def _absolute(value: str) -> str:
    return os.path.abspath(os.path.expanduser(value))


def served_command(args: argparse.Namespace) -> list[str]:
    """The cockpit command line that each browser session runs, from `serve`'s own arguments:
    read-only unless --allow-actions. `demo` attaches to the running demo (or says none runs),
    never starts a simulated host and a run of its own per browser tab. Isolated (`-I`: neither
    the folder it starts in nor PYTHON* variables reach its imports; a `cockpit/__main__.py` left
    there would otherwise run as whoever serves), its files named by absolute paths, since it
    starts in `/` (served_shell)."""
    argv = [sys.executable, "-I", "-m", "cockpit"]
    if args.fleet or args.hosts:
        argv += ["fleet", _absolute(args.fleet)] if args.fleet else ["fleet", "--hosts", args.hosts]
    else:
        argv += ["open", args.target]
    for flag in ("layout", "python", "interval", "ssh_config", "known_hosts", "sim"):
        value = getattr(args, flag)
        if value is None:
            continue
        value = str(value)
        if flag in ("ssh_config", "known_hosts") or (
            flag == "layout" and (value.endswith((".yaml", ".yml")) or "/" in value or os.path.exists(value))
        ):
            value = _absolute(value)
        elif flag == "sim" and not args.fleet and not args.hosts and args.target in ("local", "demo"):
            value = _absolute(value)  # a folder on this machine
        argv += ["--" + flag.replace("_", "-"), value]
    for flag in ("accept_new", "trust_python"):
        if getattr(args, flag, False):
            argv.append("--" + flag.replace("_", "-"))
    if args.read_only or not getattr(args, "allow_actions", False):
        argv.append("--read-only")
    return argv


def served_shell(args: argparse.Namespace) -> str:
    """What textual-serve's shell runs per browser session: served_command, started in `/`."""
    return "cd / && exec " + shlex.join(served_command(args))


_EXTERNAL = re.compile(
    r"""<(?:link|script)\b[^>]*?\b(?:href|src)\s*=\s*["']?(?:https?:)?//[^>]*>(?:\s*</script>)?""", re.IGNORECASE
)
LOCAL_FONT = """<style>
      @font-face { font-family: "Roboto Mono"; font-style: normal;
        src: url("{{ config.static.url }}fonts/RobotoMono-VariableFont_wght.ttf") format("truetype"); }
      @font-face { font-family: "Roboto Mono"; font-style: italic;
        src: url("{{ config.static.url }}fonts/RobotoMono-Italic-VariableFont_wght.ttf") format("truetype"); }
    </style>
  </head>"""


def local_page(source: str) -> str:
    """textual-serve's page template with nothing loaded from another host: its web font
    (fonts.googleapis.com) taken from the package's own static folder instead, any other
    stylesheet or script of another host left out."""
    return _EXTERNAL.sub("", source).replace("</head>", LOCAL_FONT, 1)


def make_server(command: str, host: str, port: int, token: str, title: str = "gpu-cockpit"):
    """A textual-serve Server whose every route but /static needs the token, whose WebSocket
    needs the page's own Origin, and whose page points at the host and port the browser used
    (so `ssh -L 9000:127.0.0.1:8080` works too)."""
    import aiohttp_jinja2
    import jinja2
    from aiohttp import web
    from textual_serve.server import Server, to_int

    class OwnPage(jinja2.FileSystemLoader):
        """The templates, each as `local_page` makes it."""

        def get_source(self, environment, template):
            source, filename, uptodate = super().get_source(environment, template)
            return local_page(source), filename, uptodate

    def forbidden(why: str) -> web.Response:
        return web.Response(status=403, text=f"403 forbidden: {why}\n")

    class GuardedServer(Server):
        def __init__(self):
            super().__init__(command, host=host, port=port, title=title)
            self.token = token
            self.loopback = is_loopback(host)

        @property
        def url(self) -> str:
            shown = host if host not in ("0.0.0.0", "::", "") else socket.gethostname()
            shown = f"[{shown}]" if ":" in shown else shown
            return f"http://{shown}:{port}/?token={self.token}"

        async def _make_app(self) -> web.Application:
            app = web.Application(middlewares=[self.guard])
            aiohttp_jinja2.setup(app, loader=OwnPage(self.templates_path))
            app.add_routes(
                [
                    web.get("/", self.handle_index, name="index"),
                    web.get("/ws/{token}", self.handle_websocket, name="websocket"),
                    web.get("/download/{key}", self.handle_download, name="download"),
                    web.static("/static", self.statics_path, name="static"),
                ]
            )
            app.on_startup.append(self.on_startup)
            app.on_shutdown.append(self.on_shutdown)
            return app

        def initialize_logging(self) -> None:
            super().initialize_logging()
            for handler in logging.getLogger().handlers:
                handler.addFilter(HideToken(self.token))

        def refusal(self, request: web.Request) -> str | None:
            asked = (request.url.host or "").strip("[]").lower()
            if self.loopback and not (is_loopback(asked) or asked == host.strip("[]").lower()):
                return f"Host {request.host!r} is not this machine's loopback name (a DNS-rebound page?)"
            if request.path.startswith("/static/"):
                return None  # textual-serve's own scripts and fonts: nothing of the host's
            given = request.match_info.get("token") or request.query.get("token") or ""
            if not secrets.compare_digest(given.encode(), self.token.encode()):
                return "no valid token: open the URL `cockpit serve` printed (it carries ?token=)"
            if request.path.startswith("/ws/"):
                origin = request.headers.get("Origin")
                own = f"{request.scheme}://{request.host}"
                if origin != own:
                    return f"WebSocket Origin {origin!r} is not this page's own ({own})"
            return None

        @web.middleware
        async def guard(self, request: web.Request, handler):
            why = self.refusal(request)
            if why is not None:
                return forbidden(why)
            response = await handler(request)
            response.headers["Referrer-Policy"] = "no-referrer"
            response.headers["X-Frame-Options"] = "DENY"
            response.headers["Content-Security-Policy"] = "frame-ancestors 'none'"
            response.headers["Cache-Control"] = "no-store"
            return response

        @aiohttp_jinja2.template("app_index.html")
        async def handle_index(self, request: web.Request) -> dict:
            base = f"{request.scheme}://{request.host}"
            ws = ("wss" if request.scheme == "https" else "ws") + f"://{request.host}/ws/{self.token}"
            return {
                "font_size": to_int(request.query.get("fontsize", "16"), 16),
                "app_websocket_url": ws,
                "config": {"static": {"url": f"{base}/static/"}},
                "application": {"name": self.title},
            }

        async def on_startup(self, app: web.Application) -> None:
            print(f"Serving gpu-cockpit on {self.url}", flush=True)
            print("  open that URL (it carries this start's token); other pages and origins get 403", flush=True)
            print(f"  each browser session runs: {self.command}", flush=True)
            print("  Press Ctrl+C to quit", flush=True)

    return GuardedServer()


def install_hint(extra: str) -> str:
    """How to add an extra of gpu-cockpit here: into the checkout's .venv (editable, as
    ./scripts/demo makes it) when running from a source checkout, else with pip."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / ".git").exists():
        return f"in the checkout ({root}) run `.venv/bin/pip install -e '.[{extra}]'`"
    return f"run `pip install 'gpu-cockpit[{extra}]'` in the environment of {sys.executable}"


def check_port(bind: str, port: int) -> None:
    """The address must be free before the URL is printed: one line naming it and the fix."""
    import errno

    try:
        infos = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CockpitError(f"--bind {bind}: not an address of this machine ({exc.strerror})") from None
    for family, kind, proto, _name, addr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
            try:
                probe.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise CockpitError(
                        f"port {port} on {bind} is already in use (another server?): choose a free one with --port N"
                    ) from None
                if exc.errno == errno.EACCES:
                    raise CockpitError(
                        f"port {port} on {bind}: permission denied (ports below 1024 need root): "
                        f"choose another with --port N"
                    ) from None
                raise CockpitError(
                    f"--bind {bind} --port {port}: cannot listen there ({exc.strerror}): "
                    f"choose another --bind or --port"
                ) from None


def serve(args: argparse.Namespace) -> int:
    if not 1 <= args.port <= 65535:
        raise CockpitError(f"--port {args.port}: between 1 and 65535")
    loopback = is_loopback(args.bind)
    if not loopback and not args.allow_remote:
        raise CockpitError(
            f"--bind {args.bind}: the page is plain HTTP, so its token and every key cross the "
            f"network unencrypted; keep 127.0.0.1 and reach it with "
            f"`ssh -L {args.port}:127.0.0.1:{args.port} HOST`, or add --allow-remote"
        )
    try:
        import textual_serve.server  # noqa: F401
    except ImportError:
        raise CockpitError(
            f"serve needs textual-serve, from gpu-cockpit's `serve` extra: {install_hint('serve')}"
        ) from None
    check_port(args.bind, args.port)
    if not loopback:
        print(
            f"cockpit: WARNING: serving on {args.bind}:{args.port} over plain HTTP: the token and the screen "
            f"cross the network unencrypted",
            file=sys.stderr,
        )
    command = served_command(args)
    if "--read-only" not in command:
        print(
            "cockpit: actions are ON in the browser (--allow-actions): kill, shm clean and relaunch work there",
            file=sys.stderr,
        )
    server = make_server(served_shell(args), args.bind, args.port, secrets.token_urlsafe(TOKEN_BYTES))
    try:
        server.serve()
    except OSError as exc:  # taken between the check and the server's own bind
        raise CockpitError(
            f"port {args.port} on {args.bind}: cannot listen ({exc.strerror or exc}): choose a free one with --port N"
        ) from None
    return 0
