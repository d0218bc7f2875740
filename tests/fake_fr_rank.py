"""A stand-in for one torch rank's flight-recorder dump pipe, as ProcessGroupNCCL's heartbeat
thread has it (DumpPipe): it makes the FIFO `<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe`, opens
it O_RDONLY|O_NONBLOCK, polls it every 0.2 s (torch: every TORCH_NCCL_COORD_CHECK_MILSEC with
TORCH_NCCL_DUMP_ON_TIMEOUT=1), and on any byte writes its dump to
`<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>`: here a copy of a dump file named on the command line.
Retitles itself with setproctitle (which wipes /proc/PID/environ, as real ranks do), so the agent
must read the environment from the launcher that started it.

    python tests/fake_fr_rank.py RANK DUMP_FILE [--child]
"""

import os
import sys
import time


def main():
    rank, dump = int(sys.argv[1]), sys.argv[2]
    if sys.argv[-1] != "--child":
        import subprocess

        subprocess.Popen([sys.executable, *sys.argv, "--child"]).wait()
        return
    stem, out = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"], os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    pipe = f"{stem}{rank}.pipe"
    if os.path.exists(pipe):
        os.unlink(pipe)
    os.mkfifo(pipe, 0o666)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    try:
        import setproctitle

        setproctitle.setproctitle(f"sglang::scheduler_TP{rank}" + os.environ.get("FAKE_FR_TITLE_SUFFIX", ""))
    except ImportError:
        pass
    print("ready", flush=True)
    while True:
        time.sleep(0.2)
        try:
            data = os.read(fd, 1)
        except BlockingIOError:
            continue
        if data:
            with open(dump, "rb") as src, open(f"{out}{rank}", "wb") as dst:
                dst.write(src.read())


if __name__ == "__main__":
    main()
