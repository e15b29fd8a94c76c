"""Process set-up shared by the entry points: distributed init, threads, determinism, seeding.

Also what keeps a rank from outliving its job: a process-group timeout, a watch on the launcher that
started it, one line instead of a traceback when a peer is lost, and the /dev/shm buffers unlinked on
every way out we control.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

from app.common.errors import peer_reported, write_traceback
from app.common.lifetime import die_with_parent
from app.common.logs import get_logger, library_prints
from app.common.resources import usable_cpus
from app.common.toolchain import prebuild_deepspeed_op, use_environment_scripts, use_own_extensions_dir

# Ancestors at which the launcher watch stops: the DeepSpeed runner (local launches), the ssh session
# (pdsh launches: it ends when the launching node's pdsh/ssh dies) and Slurm's step daemon.
_LAUNCHER_PROGRAMS = ("deepspeed", "sshd", "slurmstepd")
EXIT_LOST_PEER = 4
START_UP_TIMEOUT_S = 600.0  # the collectives' timeout until arm_collective_timeout (DeepSpeed's default)


def slurm_rank_env(environ: dict[str, str]) -> dict[str, str]:
    """RANK/WORLD_SIZE/LOCAL_RANK/... for a task that `srun` started (DeepSpeed's `--launcher slurm`).

    DeepSpeed's Slurm runner runs `srun -n N python app/train.py` and sets no rank variables; without this
    every task would train alone as rank 0 of 1. Only inside a job step (SLURM_STEP_NUM_TASKS is set by
    srun, not in the batch script itself), so a plain `python app/train.py` in a batch script stays world 1.
    """
    if "RANK" in environ or "SLURM_STEP_NUM_TASKS" not in environ or "SLURM_PROCID" not in environ:
        return {}
    node = int(environ.get("SLURM_NODEID", "0"))
    per_node: list[int] = []  # "2(x3),1" -> [2, 2, 2, 1]
    for part in environ.get("SLURM_STEP_TASKS_PER_NODE", environ["SLURM_STEP_NUM_TASKS"]).split(","):
        count, _, rep = part.partition("(x")
        per_node += [int(count)] * (int(rep.rstrip(")")) if rep else 1)
    out = {
        "RANK": environ["SLURM_PROCID"],
        "WORLD_SIZE": environ["SLURM_STEP_NUM_TASKS"],
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "LOCAL_SIZE": str(per_node[node] if node < len(per_node) else 1),
        "MASTER_PORT": environ.get("MASTER_PORT", str(29500 + int(environ.get("SLURM_JOB_ID", "0")) % 1000)),
    }
    out["LOCAL_WORLD_SIZE"] = out["LOCAL_SIZE"]
    if "MASTER_ADDR" not in environ:  # the first node of the step
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", environ.get("SLURM_STEP_NODELIST", "")],
            capture_output=True,
            text=True,
        ).stdout.split()
        out["MASTER_ADDR"] = hosts[0] if hosts else "127.0.0.1"
    return out


def load_secrets(environ=os.environ) -> list[str]:
    """Import KEY=VALUE lines from $MLSTM_DS_SECRETS_FILE (written 0600 by launch/train_multi_node.sh).

    DeepSpeed's multi-node runner puts every forwarded variable on the command line it logs, so the
    launch script forwards only this file's path; the values never appear in a command or a log. Variables
    already set win. Returns the names imported (never the values).
    """
    path = environ.get("MLSTM_DS_SECRETS_FILE")
    if not path:
        return []
    names = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        get_logger().warning(f"MLSTM_DS_SECRETS_FILE {path}: unreadable ({e.strerror}); no secrets imported")
        return []
    for line in lines:
        key, eq, val = line.partition("=")
        if eq and key.strip() and not key.lstrip().startswith("#") and key.strip() not in environ:
            environ[key.strip()] = val
            names.append(key.strip())
    return names


def init_distributed(timeout_s: float | None = None) -> None:
    """Initialise torch.distributed with the accelerator's backend (gloo on CPU, NCCL on CUDA).

    Works under the deepspeed launcher (RANK/WORLD_SIZE set), under srun (Slurm's variables mapped), and as
    a plain single process. `timeout_s` bounds every collective once `arm_collective_timeout` is called
    (before: at least START_UP_TIMEOUT_S), so the ranks of a dead or stalled peer stop instead of waiting.
    """
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    launched = "RANK" in os.environ
    os.environ.update(slurm_rank_env(dict(os.environ)))
    launched = launched or "RANK" in os.environ
    if not launched:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    secrets = load_secrets()
    use_environment_scripts()  # DeepSpeed JIT-builds its CPU comm op below, with ninja from PATH
    use_own_extensions_dir()  # ... and every op it builds, in a folder of ours (app/common/toolchain.py)
    if launched:
        watch_launcher(grace_s=timeout_s or 600.0)
    backend = get_accelerator().communication_backend_name()
    # start-up (engine build, stage timing, rank 0's checks while the others wait) runs under the longer
    # of the two: on a loaded machine it can outlast a short --dist-timeout-s (arm_collective_timeout)
    kwargs = {"timeout": timedelta(seconds=max(timeout_s, START_UP_TIMEOUT_S))} if timeout_s else {}
    with library_prints():  # "DeepSpeed ... shm_comm_op built successfully", once per rank
        prebuild_cpu_comm_op()
        deepspeed.init_distributed(dist_backend=backend, verbose=False, **kwargs)
    # this rank's buffers at exit, named now: a caller of main() in-process may restore its environment
    atexit.register(
        unlink_shm_segments, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], os.environ["RANK"]
    )
    if secrets and os.environ["RANK"] == "0":
        get_logger().info(f"imported {', '.join(secrets)} from MLSTM_DS_SECRETS_FILE")
    if get_accelerator().device_name() == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def prebuild_cpu_comm_op() -> None:
    """On the CPU accelerator, DeepSpeed's shared-memory all-reduce op built (or loaded) under our build lock
    before `init_distributed` loads it: a build killed mid-way (a timed-out or interrupted first launch)
    leaves torch's `lock` file, on which every later launch would wait for ever (app/common/toolchain.py).
    Where DeepSpeed would not use the op (another accelerator, not Linux) nothing is built."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return
    builder = accelerator.create_op_builder("ShareMemCommBuilder")
    if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        prebuild_deepspeed_op(builder)


def arm_collective_timeout(timeout_s: float) -> None:
    """From now on the world group's collectives wait `timeout_s` for a peer, once every rank is past
    start-up (a barrier under the start-up timeout first). torch's own setter for a live group
    (`_set_pg_timeout`, torch >= 2.3: our floor is 2.6) changes it in place on every backend of the group."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _set_pg_timeout

    dist.barrier()
    _set_pg_timeout(timedelta(seconds=timeout_s))


def release_own_shm(every_rank: bool = False) -> None:
    """This rank's buffers, or (every_rank) all of this job's on this node: when a peer died or the job is
    over, a killed peer cannot unlink its own, and unlinking one another rank still maps is harmless."""
    rank = "*" if every_rank else os.environ["RANK"]
    unlink_shm_segments(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], rank)


def unlink_shm_segments(addr: str, port: str, rank: str = "*") -> None:
    """Remove DeepSpeed's CPU all-reduce buffers (/dev/shm, ~69 MB per rank) that it never unlinks.

    Measured: without this, every launch on a new port left one segment per rank behind until /dev/shm
    filled the machine's memory. Unlinking at exit is safe: peers mapped theirs long before.
    """
    for path in glob.glob(f"/dev/shm/deepspeed_*_{addr}_{port}_{rank}"):
        with contextlib.suppress(OSError):
            os.unlink(path)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process; the start time tells a reused pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19])


def _is_launcher(pid: int) -> bool:
    """The process is the DeepSpeed runner (`[python] .../deepspeed ...`), an sshd session or slurmstepd."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    programs = [a.split()[0].rsplit("/", 1)[-1].rstrip(":") for a in argv[:2] if a.strip()]
    return any(p in _LAUNCHER_PROGRAMS for p in programs) or "deepspeed.launcher.runner" in argv


def launcher_chain(pid: int | None = None, depth: int = 4) -> list[tuple[int, int]]:
    """The ancestors whose death means this rank's job is over: up to the launcher (_LAUNCHER_PROGRAMS).

    Without a launcher among the first `depth` ancestors, only the parent (a parent-death signal's reach).
    """
    chain: list[tuple[int, int]] = []
    stat = _stat(pid or os.getpid())
    while stat is not None and stat[0] > 1 and len(chain) < depth:
        parent = stat[0]
        stat = _stat(parent)
        if stat is None:
            break
        chain.append((parent, stat[1]))
        if _is_launcher(parent):
            return chain
    return chain[:1]


def watch_launcher(interval_s: float = 0.5, grace_s: float = 600.0) -> int:
    """Stop this rank after the launcher that started it dies (SIGTERM, SIGKILL, OOM killer, lost ssh session).

    DeepSpeed's launcher runs the ranks as children that survive it; a parent-death signal would only
    cover the direct parent (DeepSpeed's per-node launch.py, which itself outlives the runner). So a small
    forked watcher process polls the ancestors up to the launcher and, when one is gone, sends the rank
    SIGTERM (the trainer saves the step in flight and exits: app/training/preemption.py) and, if it still
    runs `grace_s` later (the process-group timeout: stuck), unlinks its /dev/shm buffers and SIGKILLs it.
    A process, not a thread: a rank blocked in a collective
    can hold the GIL for as long as it waits (measured: a watcher thread never ran). The watcher dies with
    the rank (PR_SET_PDEATHSIG). Returns the watcher's pid.
    """
    chain = launcher_chain()
    rank_pid = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    try:  # the watcher: plain os calls only (the rank's torch state is not safe to touch after fork)
        die_with_parent(rank_pid)
        os.setsid()  # out of the rank's process group: a Ctrl-C meant for the job is the rank's to handle
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.closerange(3, 1 << 16)  # sockets and files of the rank stay the rank's
        while os.getppid() == rank_pid:
            time.sleep(interval_s)
            gone = next((p for p, start in chain if (_stat(p) or (0, -1))[1] != start), None)
            if gone is not None:
                _stop_rank(rank_pid, gone, interval_s, grace_s)
                break
    finally:
        os._exit(0)


def _stop_rank(rank_pid: int, gone: int, interval_s: float, grace_s: float) -> None:
    """The watcher, once the launcher is gone: SIGTERM (save and stop), then SIGKILL after `grace_s`."""
    import signal

    def say(what: str) -> None:  # the message may have nowhere to go (a closed pipe): the signal comes first
        with contextlib.suppress(OSError):
            os.write(
                2, f"[rank {os.environ.get('RANK', '?')}] launcher process {gone} is gone; {what}\n".encode()
            )

    os.kill(rank_pid, signal.SIGTERM)
    say("asked this rank to save and stop (SIGTERM)")
    deadline = time.monotonic() + grace_s
    while os.getppid() == rank_pid and time.monotonic() < deadline:
        time.sleep(interval_s)
    if os.getppid() == rank_pid:
        release_own_shm(every_rank=True)
        os.kill(rank_pid, signal.SIGKILL)
        say(f"stopped this rank (still running {grace_s:g} s after SIGTERM)")


def _is_lost_peer(e: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(
        s in text for s in ("gloo", "Gloo", "NCCL", "Connection closed by peer", "Connection reset by peer")
    )


def exit_on_lost_peer(fn: Callable[..., int]) -> Callable[..., int]:
    """A collective that fails (peer died, or stalled past --dist-timeout-s): one line, buffers unlinked, exit 4.

    The process exits at once (os._exit): tearing down a process group whose peers are gone can hang.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> int:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if not _is_lost_peer(e) or "RANK" not in os.environ:
                raise
            first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), e.__class__.__name__)
            if peer_reported():  # a peer printed why it stopped; this rank's loss of it is its consequence
                write_traceback(e)
            else:
                print(
                    f"error: rank {os.environ['RANK']} lost contact with its peers ({first[:200]}): a rank died "
                    "or stalled past --dist-timeout-s; rerun the same command to resume from the last checkpoint",
                    file=sys.stderr,
                    flush=True,
                )
            sys.stdout.flush()
            release_own_shm(every_rank=True)
            os._exit(EXIT_LOST_PEER)

    return wrapper


def set_threads() -> int:
    """Split the cores between the processes of this node unless OMP_NUM_THREADS says otherwise, and never use
    more threads than the CPUs this process may run on (app.common.resources.usable_cpus: its affinity mask
    and cgroup CPU quota; whether a mask is this process's own or shared by the node's ranks cannot be told,
    so it caps rather than divides)."""
    if "OMP_NUM_THREADS" in os.environ:
        n = int(os.environ["OMP_NUM_THREADS"])
    else:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", "1")))
        n = max(1, min((os.cpu_count() or 1) // max(1, local), usable_cpus()))
    torch.set_num_threads(n)
    return n


def deterministic_default(flag: bool | None) -> bool:
    """--deterministic as given, else on for CPU runs and off where torch sees a CUDA device."""
    return not torch.cuda.is_available() if flag is None else flag


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        # = torch.use_deterministic_algorithms(True, warn_only=True), which also imports TorchInductor to set
        # its flag; nothing here compiles
        torch.set_deterministic_debug_mode("warn")
        # Deterministic mode also NaN-fills every torch.empty (a debugging aid, not needed for
        # reproducibility). DeepSpeed's ZeRO allocates its reduce bucket (reduce_bucket_size elements,
        # 2 GB fp32 by default) with torch.empty on every micro-batch: filling it measured 17% of a P=1 step.
        torch.utils.deterministic.fill_uninitialized_memory = False
