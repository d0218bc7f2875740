"""Torch's flight recorder as the simulated ranks keep it, so the demo's `F` has something to
read: armed by the environment torch reads (TORCH_NCCL_TRACE_BUFFER_SIZE or TORCH_FR_BUFFER_SIZE,
TORCH_NCCL_DEBUG_INFO_PIPE_FILE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE), a FIFO per rank created and held
open by the rank as torch's DumpPipe does (`<stem><rank>.pipe`), polled once a second as torch's
heartbeat thread does, and on any byte a dump of the last collectives written to
`<temp stem><rank>` as a pickle of plain containers in torch's layout (cockpit/read/flightrec.py reads
it). Without TORCH_NCCL_ENABLE_TIMING torch does not track starts: entries go from `scheduled`
to `completed`, and `last_started_collective` is -1, as here."""

from __future__ import annotations

import collections
import os
import pickle
import threading
import time


def _env_int(*names: str) -> int:
    for name in names:
        try:
            return int(os.environ.get(name) or 0)
        except ValueError:
            pass
    return 0


class SimFlightRecorder:
    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        size = _env_int("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
        stem = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "")
        self.out = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
        self.armed = size > 0
        self.entries: collections.deque[dict] = collections.deque(maxlen=max(1, size))
        self.enqueued = self.completed = 0
        self.lock = threading.Lock()
        self.fd: int | None = None
        if self.armed and stem and self.out:
            path = f"{stem}{rank}.pipe"
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            os.mkfifo(path, 0o666)
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            threading.Thread(target=self._poll, daemon=True).start()

    def enqueue(self, op: str = "nccl:all_reduce") -> None:
        if not self.armed:
            return
        with self.lock:
            self.enqueued += 1
            self.entries.append(
                {
                    "record_id": self.enqueued,
                    "pg_id": 0,
                    "process_group": ["0", "default_pg"],
                    "collective_seq_id": self.enqueued,
                    "p2p_seq_id": 0,
                    "op_id": self.enqueued,
                    "profiling_name": op,
                    "time_created_ns": time.time_ns(),
                    "state": "scheduled",
                    "input_sizes": [[4096]],
                    "output_sizes": [[4096]],
                    "is_p2p": False,
                    "retired": False,
                    "timeout_ms": 600000,
                }
            )

    def complete(self) -> None:
        if not self.armed:
            return
        with self.lock:
            self.completed = self.enqueued
            if self.entries:
                self.entries[-1]["state"] = "completed"

    def _poll(self) -> None:
        while True:
            time.sleep(1.0)
            try:
                data = os.read(self.fd, 128)
            except BlockingIOError:
                continue
            except OSError:
                return
            if data:
                self.dump()

    def dump(self) -> None:
        with self.lock:
            doc = {
                "version": "2.10",
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(self.world)))}},
                "pg_status": {
                    "0": {
                        "last_enqueued_collective": self.enqueued,
                        "last_started_collective": -1,
                        "last_completed_collective": self.completed,
                    }
                },
                "entries": [dict(e) for e in self.entries],
            }
        path = f"{self.out}{self.rank}"
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(doc, fh, protocol=2)
        os.replace(tmp, path)
