"""Process set-up shared by the entry points: distributed init, threads, determinism, seeding."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def init_distributed() -> None:
    """Initialise torch.distributed with the accelerator's backend (gloo on CPU, NCCL on CUDA).

    Works under the deepspeed launcher (RANK/WORLD_SIZE set) and as a plain single process.
    """
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    backend = get_accelerator().communication_backend_name()
    deepspeed.init_distributed(dist_backend=backend, verbose=False)
    if get_accelerator().device_name() == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def set_threads() -> int:
    """Split the cores between the processes of this node unless OMP_NUM_THREADS says otherwise."""
    if "OMP_NUM_THREADS" in os.environ:
        n = int(os.environ["OMP_NUM_THREADS"])
    else:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", "1")))
        n = max(1, (os.cpu_count() or 1) // max(1, local))
    torch.set_num_threads(n)
    return n


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
