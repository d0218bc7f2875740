"""The frame protocol: its version, the frame types and the one writer of frames. The operator side
imports this module too, so the frame schema has one home.
"""

import json
import os
import threading

PROTOCOL = 2  # 2: a sample names the processes that left (`gone`); one it leaves out stands, unless it is `full`
AGENT_VERSION = "0.1.0"

# Frame types written by the agent.
HELLO, SAMPLE, LOG, RESULT, ERROR, FATAL = "hello", "sample", "log", "result", "error", "fatal"


_out_lock = threading.Lock()
_encode = json.JSONEncoder(
    separators=(",", ":"), default=str
).encode  # one encoder: json.dumps with options builds one a call


def emit(frame):
    frame["v"] = PROTOCOL
    data = (_encode(frame) + "\n").encode()
    with _out_lock:  # straight to the descriptor, whole: the frames are the only writes to stdout
        try:
            while data:
                data = data[os.write(1, data) :]
        except OSError:
            os._exit(0)  # the cockpit went away


class Refused(Exception):
    """An action the agent will not carry out; the message says why and what to do."""
