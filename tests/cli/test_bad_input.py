"""Bad input: one line naming file:line and the fix, exit status 2, never a traceback; fuzzed
decoder and layout loader never crash or hang; values never become shell syntax."""

import json
import sys

import pytest
from conftest import free_port, run_cli
from hypothesis import given, settings, strategies as st

from cockpit.host.session import decode_frame
from cockpit.monitor.fleet import parse_fleet
from cockpit.runs.config import LayoutError
from cockpit.runs.layoutfile import parse_layout

GOOD = "command: [-m, sglang.launch_server]\n"


@pytest.mark.parametrize(
    "text, line, expect",
    [
        ("command: [-m, x\n", 1, "invalid YAML: a flow sequence opened on this line is not closed"),
        (
            "name: x\ncommand: [-m, x\nports: [1]\n",
            2,
            "a flow sequence opened on this line is not closed (expected ',' or ']', but got ':' on line 3)",
        ),
        ('name: "x\ncommand: [-m, x]\n', 1, "a quoted scalar opened on this line is not closed"),
        ("command: [-m, x]\n ports: [1]\n", 2, "check this line's indentation"),
        (GOOD + "flag_set:\n  a: [--x]\n", 2, "did you mean 'flag_sets'?"),
        (GOOD + "ports: 8000\n", 2, "ports must be a list"),
        ("base_flags: [--x]\n", 1, "missing command"),
        (GOOD + "flag_sets:\n  eagle3: [--a]\n  eagle3: [--b]\n", 4, "duplicate key 'eagle3'"),
        (GOOD + "flag_sets:\n  eagle3: --speculative-algorithm EAGLE3\n", 3, "flag set 'eagle3' must be a list"),
        (GOOD + "phases:\n  - {pattern: '([', phase: x}\n", 3, "bad regex"),
        (GOOD + "stall: {idle_s: -5}\n", 2, "stall.idle_s must be >= 0"),
        (GOOD + "ports: [99999]\n", 2, "between 1 and 65535"),
        (GOOD + "engine: tensorrt\n", 2, "engine must be one of"),
        (GOOD + "enabled: [eagle3]\n", 2, "not a flag set"),
        (GOOD + "stall: {idle_s: soon}\n", 2, "must be a number"),
        ("", 1, "the layout is empty"),
        ("- just\n- a list\n", 1, "must be a mapping"),
    ],
)
def test_layout_errors_name_file_line_and_fix(text, line, expect):
    with pytest.raises(LayoutError) as err:
        parse_layout(text, "bad.yaml")
    msg = str(err.value)
    assert msg.startswith(f"bad.yaml:{line}: ") and expect in msg and "\n" not in msg


def test_cli_bad_layout_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD + "stall:\n  spin: 3\n")
    res = run_cli("snapshot", "local", "--layout", str(bad), "--json")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == f"cockpit: {bad}:3: unknown key 'spin' in stall: did you mean 'spin_s'?"
    missing = run_cli("snapshot", "local", "--layout", str(tmp_path / "nope.yaml"), "--json")
    assert missing.returncode == 2 and "no such layout file" in missing.stderr
    replay = tmp_path / "r.json"
    replay.write_text("{not json")
    res = run_cli("snapshot", "--replay", str(replay), "--svg", str(tmp_path / "o.svg"))
    assert res.returncode == 2 and f"{replay}:1: not a JSON snapshot" in res.stderr


@pytest.mark.timeout(120)  # a pattern that backtracks or a loop that never ends fails here, not the suite
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_frame_decoder_never_raises(data):
    frame = decode_frame(data)
    assert frame is None or (isinstance(frame, dict) and frame["v"] == 1)


@pytest.mark.timeout(120)  # a pattern that backtracks or a loop that never ends fails here, not the suite
@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
        max_leaves=20,
    )
)
def test_layout_and_fleet_loaders_only_ever_raise_one_line_errors(value):
    for parse in (parse_layout, parse_fleet):
        try:
            parse(json.dumps(value), "fuzz.yaml")
        except LayoutError as exc:
            assert str(exc).startswith("fuzz.yaml:") and "\n" not in str(exc)


@pytest.mark.timeout(120)  # a pattern that backtracks or a loop that never ends fails here, not the suite
@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_layout_and_fleet_loaders_survive_any_text(text):
    for parse in (parse_layout, parse_fleet):
        try:
            parse(text, "t.yaml")
        except LayoutError as exc:
            assert str(exc).startswith("t.yaml")


def test_a_layout_value_is_one_literal_argument_over_ssh(tmp_path, sim_state, sshd):
    victim = tmp_path / "victim"
    victim.write_text("still here")
    port = free_port()
    layout = tmp_path / "inj.yaml"
    layout.write_text(f"""name: inj{port}
command: [-m, cockpit.sim.server]
base_flags: [--tp-size, "1", --port, "{port}", --model-path, "x; rm -rf {victim}", --sim-speed, "8"]
log_dir: {tmp_path}
ports: [{port}]
watch: []
kill_wait_s: 2
""")
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    common = [
        "cockpit-test",
        "--python",
        sys.executable,
        "--sim",
        str(sim_state),
        "--layout",
        str(layout),
        *sshd.cli_args(),
    ]
    res = run_cli("launch", *common, "--yes", "--timeout", "40", env=env, timeout=120)
    try:
        assert res.returncode == 0, res.stderr
        assert ": ready" in res.stdout
        assert victim.read_text() == "still here"
        logs = list(tmp_path.glob(f"inj{port}-*.log"))
        assert logs and f"model_path='x; rm -rf {victim}'" in logs[0].read_text()
        killed = run_cli("kill", *common, "--yes", env=env)  # found again through the ledger, though ready
        assert killed.returncode == 0 and "verified" in killed.stdout, killed.stdout + killed.stderr
    finally:
        __import__("subprocess").run(["pkill", "-9", "-f", f"sim.server.*port {port}"])
    python = run_cli("snapshot", "cockpit-test", "--json", "--python", f"python3; rm -rf {victim}", *sshd.cli_args())
    assert python.returncode == 2 and "not found" in python.stderr and victim.exists()
