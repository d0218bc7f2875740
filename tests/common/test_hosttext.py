"""The one rule for host text (cockpit/hosttext.py): control characters shown, never acted on;
markup never let through; anything printable, whatever bytes the host sent."""

from hypothesis import given, settings, strategies as st
from rich.console import Console
from rich.text import Text

from cockpit.common.hosttext import as_text, escape_markup, visible


def test_osc_52_clipboard_write_is_shown_not_sent():
    assert visible("\x1b]52;c;ZXZpbA==\x07") == "^[]52;c;ZXZpbA==^G"
    assert visible("\x1b]52;c;ZXZpbA==\x1b\\") == "^[]52;c;ZXZpbA==^[\\"


def test_clear_screen_carriage_return_and_the_rest_of_c0_and_del():
    assert visible("\x1b[2Jgone") == "^[[2Jgone"
    assert visible("50%\r100%") == "50%^M100%"
    assert visible("a\x00b\x08c\x7fd") == "a^@b^Hc^?d"
    assert visible("one\ntwo") == "one^Jtwo"
    assert visible("one\ntwo\r", newlines=True) == "one\ntwo^M"
    assert all(visible(chr(c)).startswith("^") and len(visible(chr(c))) == 2 for c in [*range(32), 127] if c != 9)


def test_c1_controls_bidi_overrides_and_line_separators():
    assert visible("\x9b2J") == "\\u009b2J"  # the 8-bit CSI
    assert visible("\x85") == "\\u0085"
    assert visible("admin\u202e\u2066txt.exe") == "admin\\u202e\\u2066txt.exe"
    assert visible("a\u2028b") == "a\\u2028b"


def test_invalid_utf8_and_lone_surrogates_show_as_what_they_were():
    raw = b"ok \xff\xfe \xe9t\xe9 \xc3\xa9"
    assert visible(raw) == "ok \\xff\\xfe \\xe9t\\xe9 é"
    assert visible(raw.decode("utf-8", "surrogateescape")) == visible(raw)
    assert visible("x\ud800y") == "x\\ud800y"
    visible(raw).encode("utf-8")  # printable: never a UnicodeEncodeError


def test_tabs_become_spaces_to_the_next_stop_counting_shown_columns():
    assert visible("a\tb") == "a" + " " * 7 + "b"
    assert visible("\x1b\tb") == "^[" + " " * 6 + "b"
    assert visible("a\tb", tabs=None) == "a^Ib"
    assert visible("x\ty\nab\tc", newlines=True) == "x       y\nab      c"


def test_plain_text_is_unchanged_and_none_is_empty():
    s = "sglang::scheduler_TP0 [rank 0] 100% — é 中文 🙂"
    assert visible(s) is s
    assert visible(None) == ""


def test_markup_never_gets_through():
    hostile = "[bold red]FAKE[/] [link=http://evil.example]x[/link] \\"
    console = Console(width=200, record=True, color_system=None)
    console.print(f"[yellow]{escape_markup(hostile)}[/]")
    console.print(as_text(hostile + "\x1b[2J"))
    out = console.export_text()
    assert out.splitlines()[0] == hostile
    assert out.splitlines()[1] == hostile + "^[[2J"
    assert isinstance(as_text("x"), Text) and as_text("[b]x[/b]").plain == "[b]x[/b]"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_nothing_a_terminal_acts_on_survives(data):
    out = visible(data)
    out.encode("utf-8")
    assert not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in out)
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in out)
    multi = visible(data, newlines=True)
    assert not any((ord(c) < 32 and c != "\n") or 0x7F <= ord(c) <= 0x9F for c in multi)


def test_the_cli_prints_host_text_visibly_in_kill_plans_shm_listings_and_stacks():
    from cockpit.actions.kill import KillPlan, describe_shm
    from cockpit.read.stacks import Group, describe_groups

    evil = "\x1b]52;c;ZXZpbA==\x07\x1b[2J"
    plan = KillPlan(None, [{"pid": 1, "pgid": 1, "sid": 1, "status": "S", "title": "python " + evil}])
    shm = describe_shm(
        {
            "folder": "/dev/shm",
            "free_bytes": 1,
            "total_bytes": 2,
            "entries": [
                {
                    "name": "psm_" + evil,
                    "kind": "file",
                    "bytes": 0,
                    "size": 0,
                    "age_s": 1.0,
                    "owner": "r\x1bt",
                    "held_by": [],
                    "creator": None,
                    "creator_alive": None,
                    "removable": True,
                }
            ],
        }
    )
    stacks = describe_groups(
        [Group(ranks=[0, 1], frames=("wait (x.py:1)" + evil,), odd=False, diff=["--- a", "+++ b", "-" + evil])]
    )
    text = "\n".join(plan.describe() + shm + stacks)
    assert "\x1b" not in text and "\x07" not in text
    assert "^[]52;c;ZXZpbA==^G^[[2J" in text and "r^[t" in text
