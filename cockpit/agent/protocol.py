"""The frame protocol: its version, the frame types and the one writer of frames. The operator side
imports this module too, so the frame schema has one home.
"""

import json
import os
import sys
import threading

PROTOCOL = 1
AGENT_VERSION = "0.1.0"

# Frame types written by the agent.
HELLO, SAMPLE, LOG, RESULT, ERROR, FATAL = "hello", "sample", "log", "result", "error", "fatal"


_out_lock = threading.Lock()


def emit(frame):
    frame["v"] = PROTOCOL
    data = json.dumps(frame, separators=(",", ":"), default=str) + "\n"
    with _out_lock:
        try:
            sys.stdout.write(data)
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            os._exit(0)


class Refused(Exception):
    """An action the agent will not carry out; the message says why and what to do."""
