"""The README's commands as a new user types them: after `./scripts/demo` (which makes `.venv`),
`cockpit` is reached the way the README says, from another terminal in the checkout's folder."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).parents[2]
ACTIVATE = ". .venv/bin/activate"


def sh_blocks(text: str) -> list[list[str]]:
    return [block.strip().splitlines() for block in re.findall(r"```sh\n(.*?)```", text, re.S)]


def test_every_cockpit_command_of_the_walk_through_is_reachable_as_written():
    readme = (REPO / "README.md").read_text()
    try_it = readme.split("## Try it", 1)[1].split("\n## ", 1)[0]
    for block in sh_blocks(try_it):
        for i, line in enumerate(block):
            if line.startswith("cockpit "):  # the bare word needs the venv on PATH first, in the same block
                assert any(earlier.startswith(ACTIVATE) for earlier in block[:i]), block
    prose = " ".join(try_it.split())
    assert f"From another terminal, in the checkout's folder, `{ACTIVATE}` puts `cockpit` on that shell's PATH" in prose
    use_it = " ".join(readme.split("## Use it", 1)[1].split("```sh", 1)[0].split())
    assert f"`cockpit` is `.venv/bin/cockpit` in a checkout (`{ACTIVATE}`" in use_it
    demo = (REPO / "scripts" / "demo").read_text()
    assert ACTIVATE in demo  # said on the demo's terminal too, before the screen takes it


def test_the_activation_the_readme_names_puts_the_checkouts_cockpit_on_path(tmp_path):
    """In a fresh shell (a PATH without the venv), the README's line, then `cockpit`."""
    out = subprocess.run(
        ["bash", "-c", f"{ACTIVATE} && command -v cockpit && cockpit --version"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    where, version = out.stdout.splitlines()
    assert Path(where) == REPO / ".venv" / "bin" / "cockpit" and version.startswith("gpu-cockpit ")
