"""Any checkpoint -> the full model state dict, whatever parallel layout wrote it. Safe loading only.

The result always has the keys of `app.parallel.pipeline.SequentialModel` ("{i}.{name}", layer i of
`layer_specs`), float32, on the CPU. DeepSpeed writes the weights in one of three ways:

    P > 1 (PipelineModule)   layer_{i:02d}-model_states.pt per layer, keys without the "{i}." prefix;
                             a tied head has no file of its own (it is layer 0's embedding)
    P = 1, ZeRO 0-2          mp_rank_00_model_states.pt, entry "module" = the SequentialModel state dict
    P = 1, ZeRO-3            parameters partitioned over the ranks: the fp32 master copy is rebuilt from
                             every rank's zero_pp_rank_{r}_mp_rank_00_optim_states.pt (fp32_flat_groups),
                             in the order of param_shapes in the matching *_model_states.pt

bf16/fp16 module weights are cast to float32. Every file goes through `safe_load`: `torch.load` with
`weights_only=True`, which rebuilds tensors and plain containers and refuses anything else (a pickle that
would import a function or build an arbitrary object is rejected before any of it runs). DeepSpeed's own
`zero_to_fp32` loads with `weights_only=False`, so ZeRO-3 consolidation is done here instead.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from app.checkpoints.safety import load_weights_only
from app.common.errors import UserError
from app.model.config import ModelConfig

StateDict = dict[str, torch.Tensor]

_LAYER_FILE = re.compile(r"^layer_(\d+)-model_states\.pt$")


class _Inert:
    """Stand-in for the DeepSpeed objects in a ZeRO optimizer file (its LossScaler): state kept, no code run."""

    def __setstate__(self, state: object) -> None:
        self.state = state


# What a ZeRO-3 optimizer partition holds besides tensors and containers, mapped to inert stand-ins so
# that nothing of DeepSpeed is imported or run while reading it: the stage enum is rebuilt as int(stage).
ZERO_OPTIM_STAND_INS = [
    (int, "deepspeed.runtime.zero.config.ZeroStageEnum"),
    (_Inert, "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
]


def safe_load(path: Path, stand_ins: list[tuple[type, str]] = ()) -> object:
    """`torch.load(path, weights_only=True)` on the CPU; anything unsafe or unreadable is a UserError.

    `stand_ins` allow-lists specific named globals, each replaced by the given harmless type.
    """
    return load_weights_only(
        path,
        list(stand_ins),
        "it holds more than tensors and plain containers",
        "only weights-only files are read (torch.load weights_only=True)",
        mmap=True,
    )


def _as_dict(obj: object, path: Path) -> dict:
    if not isinstance(obj, dict):
        raise UserError(f"{path}: expected a dict of tensors, found {type(obj).__name__}")
    return obj


def _pipeline_state(ckpt: Path, num_specs: int, tied: bool) -> StateDict:
    files = {int(m.group(1)): p for p in ckpt.iterdir() if (m := _LAYER_FILE.match(p.name))}
    expected = [i for i in range(num_specs) if not (tied and i == num_specs - 1)]
    missing = [f"layer_{i:02d}-model_states.pt" for i in expected if i not in files]
    if missing:
        raise UserError(f"--checkpoint {ckpt}: missing {', '.join(missing)}")
    out: StateDict = {}
    for i in expected:
        for name, t in _as_dict(safe_load(files[i]), files[i]).items():
            out[f"{i}.{name}"] = t
    return out


def _module_state(ckpt: Path) -> StateDict:
    path = ckpt / "mp_rank_00_model_states.pt"
    if not path.is_file():
        raise UserError(f"--checkpoint {ckpt}: no layer_*-model_states.pt and no {path.name}")
    module = _as_dict(safe_load(path), path).get("module")
    if not isinstance(module, dict) or not module:
        raise UserError(
            f"{path}: has no 'module' weights (a ZeRO-3 checkpoint whose app_state says otherwise?)"
        )
    return dict(module)


def _zero3_state(ckpt: Path) -> StateDict:
    """Rebuild full fp32 parameters from the ZeRO-3 partitions of every data-parallel rank."""
    optim = sorted(ckpt.glob("zero_pp_rank_*_mp_rank_00_optim_states.pt"), key=_rank_of)
    models = sorted(ckpt.glob("zero_pp_rank_*_mp_rank_00_model_states.pt"), key=_rank_of)
    if not optim or len(optim) != len(models):
        raise UserError(
            f"--checkpoint {ckpt}: ZeRO-3 needs one optim and one model states file per rank, "
            f"found {len(optim)} and {len(models)}"
        )
    world = len(optim)
    meta = _as_dict(safe_load(models[0]), models[0])
    shapes: dict[str, torch.Size] = {}
    for group in meta.get("param_shapes") or []:
        shapes.update(group)
    flats = []
    for path in optim:
        osd = _as_dict(
            _as_dict(safe_load(path, ZERO_OPTIM_STAND_INS), path).get("optimizer_state_dict"), path
        )
        if osd.get("zero_stage") != 3 or "fp32_flat_groups" not in osd:
            raise UserError(f"{path}: not a ZeRO-3 optimizer partition (zero_stage {osd.get('zero_stage')})")
        if osd.get("partition_count") not in (world, [world] * len(osd["fp32_flat_groups"])):
            raise UserError(
                f"{path}: written by {osd.get('partition_count')} ranks, but {world} partition files exist"
            )
        flats.append(torch.cat([g.reshape(-1).float() for g in osd["fp32_flat_groups"]]))
    out: StateDict = {}
    offset = 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        part = -(-n // world)  # each rank holds ceil(n / world) elements of every parameter, zero-padded
        full = torch.cat([f[offset : offset + part] for f in flats])
        out[name] = full[:n].view(shape).clone()
        offset += part
    if offset != flats[0].numel():
        raise UserError(
            f"--checkpoint {ckpt}: ZeRO-3 partitions hold {flats[0].numel()} values, expected {offset}"
        )
    return out


def _rank_of(p: Path) -> int:
    return int(re.search(r"zero_pp_rank_(\d+)_", p.name).group(1))  # type: ignore[union-attr]


def checkpoint_state_dict(ckpt: Path, model_cfg: ModelConfig, zero_stage: int) -> StateDict:
    """The full float32 SequentialModel state dict of the checkpoint folder `ckpt` (checked for shapes)."""
    num_specs = model_cfg.num_layers + 2
    if any(_LAYER_FILE.match(p.name) for p in ckpt.iterdir()):
        sd = _pipeline_state(ckpt, num_specs, model_cfg.tie_embeddings)
    elif zero_stage == 3:
        sd = _zero3_state(ckpt)
    else:
        sd = _module_state(ckpt)
    sd = {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}
    check_state_dict(sd, model_cfg, str(ckpt))
    return sd


def expected_shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the SequentialModel state dict, without building DeepSpeed or real tensors."""
    from app.model.lm import InferenceModel

    with torch.device("meta"):
        model = InferenceModel(model_cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_state_dict(sd: StateDict, model_cfg: ModelConfig, source: str) -> None:
    check_shapes({k: tuple(v.shape) for k, v in sd.items()}, model_cfg, source)


def check_shapes(shapes: dict[str, tuple[int, ...]], model_cfg: ModelConfig, source: str) -> None:
    """The weights' names and shapes are the model config's (one line naming `source` otherwise)."""
    want = expected_shapes(model_cfg)
    missing = sorted(set(want) - set(shapes))
    extra = sorted(set(shapes) - set(want))
    if missing or extra:
        raise UserError(
            f"{source}: weights do not match the model config (missing {missing or 'none'}, "
            f"unexpected {extra or 'none'})"
        )
    bad = [f"{k} {shapes[k]} != {s}" for k, s in want.items() if shapes[k] != s]
    if bad:
        raise UserError(f"{source}: weight shapes do not match the model config: {'; '.join(bad)}")


def to_module_state(full: StateDict, module: torch.nn.Module) -> StateDict:
    """The entries of `full` (SequentialModel keys) that `module` holds: a whole SequentialModel, or one
    pipeline stage, whose tied embedding lives under "tied_modules.<key>." instead of "0."."""
    out: StateDict = {}
    for name in module.state_dict():
        src = re.sub(r"^tied_modules\.[^.]+\.", "0.", name)
        if src not in full:
            raise KeyError(f"no weight for {name} ({src}) in the converted state dict")
        out[name] = full[src]
    return out
