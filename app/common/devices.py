"""Which device a run asked for, and what torch sees: no silent fallback.

A run that asks for a GPU (`--device cuda`, `--device cuda:N`, the quickstart's `DEVICE=gpu`) gets one or
stops in one line that says what torch sees (a CPU-only build; a CUDA build that finds no device, with
CUDA_VISIBLE_DEVICES and the driver's complaint; fewer devices than the index asked for) and how to fix it.
`auto` is the only mode that falls back to the CPU, and it says which device it chose and why.
"""

from __future__ import annotations

import os
import sys

TORCH_FIX = (
    "install a CUDA build of torch (e.g. TORCH_SPEC='torch==2.11.0' "
    "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu128 ./launch/setup_env.sh)"
)


def cuda_seen() -> str:
    """What torch sees of CUDA, in words: "torch 2.13.0+cpu is a CPU-only build", "torch 2.11.0+cu128
    (CUDA 12.8) sees 2 CUDA device(s)", or why a CUDA build sees none."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build (no CUDA)"
    build = f"torch {torch.__version__} (CUDA {torch.version.cuda})"
    if torch.cuda.is_available():
        return f"{build} sees {torch.cuda.device_count()} CUDA device(s)"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and not hidden.strip():
        return f"{build} sees no CUDA device: CUDA_VISIBLE_DEVICES is empty"
    try:
        torch.cuda.init()  # is_available() swallows the driver's reason; init() raises it
        why = "none was found"
    except Exception as e:  # the driver's own words (no driver, too old, no device), whatever the type
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    where = f" (CUDA_VISIBLE_DEVICES={hidden})" if hidden is not None else ""
    return f"{build} sees no CUDA device{where}: {why}"


def cuda_fix(cpu_choice: str) -> str:
    """How to get past a missing GPU: a CUDA build, a visible device, or the CPU (`cpu_choice`, the flag or
    setting that asks for it)."""
    import torch

    if torch.version.cuda is None:
        return f"{TORCH_FIX}, or run on the CPU ({cpu_choice})"
    return f"check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES, or run on the CPU ({cpu_choice})"


def resolve(name: str, flag: str, say=None, cpu_choice: str | None = None, asked: str | None = None):
    """`name` (cpu, cuda, cuda:N or auto, given as `flag`, e.g. "--device") -> a torch.device; a GPU that is
    not there is a UserError in one line, which starts with `asked` (default "FLAG NAME") and ends with
    how to run on the CPU (`cpu_choice`, default "FLAG cpu, or FLAG auto"). `auto` falls back to the CPU,
    and says which device it chose through `say`."""
    import torch

    from app.common.errors import UserError

    if name == "auto":
        if torch.cuda.is_available():
            dev = torch.device("cuda", torch.cuda.current_device())
            if say is not None:
                say(f"{flag} auto: {dev}, {torch.cuda.get_device_name(dev)}")
            return dev
        if say is not None:
            say(f"{flag} auto: cpu, as {cuda_seen()}")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"{flag} {name!r}: expected cpu, cuda, cuda:N or auto") from None
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"{flag} {name!r}: expected cpu, cuda, cuda:N or auto")
    if dev.type == "cuda":
        asked = asked or f"{flag} {name}"
        if not torch.cuda.is_available():
            raise UserError(
                f"{asked}: {cuda_seen()}; {cuda_fix(cpu_choice or f'{flag} cpu, or {flag} auto')}"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(f"{asked}: {cuda_seen()}; pick one of cuda:0..{torch.cuda.device_count() - 1}")
    return dev


def rank_device(name: str, flag: str, say=None):
    """`resolve` for one rank of a launch: `auto` (on a machine with CUDA) and `cuda` mean this rank's own
    device, cuda:LOCAL_RANK (DeepSpeed's launcher shows every rank the node's devices and numbers the ranks
    of a node by LOCAL_RANK); cpu and cuda:N are as asked. `auto` says what it chose through `say`."""
    import torch

    from app.common.errors import UserError

    dev = resolve(name, flag, None if torch.cuda.is_available() else say)
    if dev.type != "cuda" or ":" in name:
        return dev
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if local >= torch.cuda.device_count():
        raise UserError(
            f"{flag} {name}: this is local rank {local}, but {cuda_seen()}; launch at most "
            f"{torch.cuda.device_count()} ranks a node (deepspeed --num_gpus)"
        )
    dev = torch.device("cuda", local)
    if name == "auto" and say is not None:
        say(f"{flag} auto: {dev}, {torch.cuda.get_device_name(dev)}")
    return dev


def quickstart_device(asked: str) -> int:
    """launch/quickstart.sh's DEVICE (auto, cpu or gpu): prints the device to use (cpu or gpu) on stdout and
    what decided it on stderr; DEVICE=gpu without a usable GPU is one error line and exit status 2."""
    from app.common.errors import EXIT_USER_ERROR, UserError

    try:
        name = {"gpu": "cuda", "cpu": "cpu", "auto": "auto"}[asked]
        say = lambda line: print(f"[quickstart] {line}", file=sys.stderr)  # noqa: E731
        dev = resolve(name, "DEVICE", say, cpu_choice="DEVICE=cpu, or DEVICE=auto", asked=f"DEVICE={asked}")
    except KeyError:
        print(f"error: DEVICE must be auto, cpu or gpu, not {asked!r}", file=sys.stderr)
        return EXIT_USER_ERROR
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    print("gpu" if dev.type == "cuda" else "cpu")
    return 0
