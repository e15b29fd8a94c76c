"""Does this torch's gloo honour a timeout set on a live process group (`_set_pg_timeout`)?

    python tests/dist/gloo_timeout_probe.py PORT   # prints "honoured" or "ignored"

Two processes; rank 1 stays silent for 20 s while rank 0 runs an all-reduce after setting a 2 s timeout.
torch 2.6's gloo keeps the timeout the group was created with (pytorch/pytorch#165422), so rank 0 waits
until rank 1 leaves; later releases raise after 2 s.
"""

import os
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _set_pg_timeout


def rank_main(rank: int, port: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    dist.barrier()
    _set_pg_timeout(timedelta(seconds=2))
    if rank == 1:
        time.sleep(20)
        os._exit(0)
    t = time.time()
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError:
        pass
    print("honoured" if time.time() - t < 10 else "ignored", flush=True)
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        rank_main(int(sys.argv[2]), sys.argv[1])
    silent = subprocess.Popen([sys.executable, __file__, sys.argv[1], "1"])
    try:
        rank_main(0, sys.argv[1])
    finally:
        silent.kill()
