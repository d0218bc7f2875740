"""Builds the flight-recorder test dumps in this folder: CONSTRUCTED, not recorded.

No GPU and no torch here, and torch's flight recorder needs the NCCL backend, so these pickles are
built to match the format torch writes (torch/csrc/distributed/c10d/FlightRecorderDetail.hpp,
version "2.10": dump_dict() -> pickle_str(); `entries` from getCollectiveTrace with
record_id, pg_id, process_group (name, desc), collective_seq_id, p2p_seq_id, op_id,
profiling_name "nccl:all_reduce", time_created_ns, input/output sizes and dtypes, state
scheduled|started|completed, time_discovered_started_ns / _completed_ns (None when not yet),
retired, timeout_ms, is_p2p, frames; `pg_status` per pg id with last_enqueued/started/completed;
`pg_config` per group name with name, desc and ranks as text).

The scene: two ranks of tests/gpu/tp_job.py, rank 1 stopped calling collectives after
all_reduce #41 (--hang-rank 1); rank 0 enqueued and started #42 and waits in it.

tests/gpu/run_device5.sh records real dumps on H200s (fr-rank0.pickle, fr-rank1.pickle in its
$OUT); they are added beside these as recorded-rank*.pickle with a note in README.md.

    python tests/data/flight-recorder/make_dumps.py
"""

import pickle
from pathlib import Path

HERE = Path(__file__).parent
T0 = 1764516932_000_000_000


def entry(seq, state, rank):
    created = T0 + seq * 25_000_000
    return {
        "frames": [
            {"name": "all_reduce", "filename": "torch/distributed/distributed_c10d.py", "line": 2950},
            {"name": "decode_loop", "filename": "tests/gpu/tp_job.py", "line": 44},
        ],
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": created,
        "duration_ms": None if state != "completed" else 0.41,
        "input_sizes": [[1048576]],
        "input_dtypes": ["Float"],
        "output_sizes": [[1048576]],
        "output_dtypes": ["Float"],
        "state": state,
        "time_discovered_started_ns": None if state == "scheduled" else created + 10_000,
        "time_discovered_completed_ns": created + 500_000 if state == "completed" else None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": False,
    }


def dump(rank, last):
    entries = [entry(seq, "completed", rank) for seq in range(1, last + 1)]
    if rank == 0:
        entries.append(entry(42, "started", rank))
    for e in entries:
        if e["duration_ms"] is None:
            del e["duration_ms"]  # torch writes the key only when it has a duration
    enq = 42 if rank == 0 else 41
    return {
        "version": "2.10",
        "comm_lib_version": "2.28.9",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {"last_enqueued_collective": enq, "last_started_collective": enq, "last_completed_collective": 41}
        },
        "entries": entries,
    }


if __name__ == "__main__":
    for rank in (0, 1):
        (HERE / f"constructed-rank{rank}.pickle").write_bytes(pickle.dumps(dump(rank, 41), protocol=2))
    # torch's own pickler writes int lists through torch.jit._pickle.build_intlist: one such list
    (HERE / "constructed-intlist.pickle").write_bytes(
        b"\x80\x02}q\x00X\x07\x00\x00\x00entriesq\x01]q\x02}q\x03(X\x0b\x00\x00\x00input_sizesq\x04"
        b"ctorch.jit._pickle\nbuild_intlist\nq\x05]q\x06(K\x01K\x02e\x85q\x07Rq\x08X\x11\x00\x00\x00"
        b"collective_seq_idq\tK\x07uas."
    )
    # a hostile file: unpickling it with pickle.load would run a shell command
    (HERE / "hostile.pickle").write_bytes(b"cos\nsystem\n(S'touch /tmp/cockpit-pwned'\ntR.")
