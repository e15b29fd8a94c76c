"""The model as DeepSpeed pipeline layers: the ONLY file of the model that knows about DeepSpeed.

`layer_specs(cfg)` is the model: [embedding, one spec per recurrent layer, head]. The same list builds
- `build_pipeline(cfg, num_stages, ...)`: a PipelineModule split over stages (dynamic_shape=True, since
  sequence length changes between buckets), and
- `build_sequential(cfg)`: `app.model.lm.LanguageModel`, the plain module for one stage / ZeRO-2/3.

Layer i of the list is layer i everywhere. Weights do not depend on the layout: layer i is built right
after `torch.manual_seed(base_seed + i)` in both builders (DeepSpeed's seed_layers mechanism).

Checkpoint layout. DeepSpeed saves a pipeline model one file per layer,
`<ckpt>/<tag>/layer_{i:02d}-model_states.pt`, holding that layer module's own state_dict (keys without
the index prefix). The LanguageModel's state_dict uses the same index as a prefix: key
"{i}.{name}" <-> file layer_{i:02d}, key "{name}". With tied embeddings the embedding module is built
once (DeepSpeed keeps it in `tied_modules.embed`, and on a pipeline every stage holding a tied spec has
a copy, kept in sync by an all-reduce of its gradient). Only the spec that runs the module's own
forward (the embedding, index 0) owns a file (`layer_00`, key "weight"); the head slot runs a function
of that module, so DeepSpeed writes no file for it and the LanguageModel has no "{last}." keys.
Untied: layer_00 {"weight"}, layer_{L+1:02d} {"weight", "bias"}. Recurrent layers: see
`app.model.layers.RecurrentLayer` for names.

Partition methods (`PARTITION_METHODS`): DeepSpeed's "parameters", "uniform", "type:<regex>", and
"cost", which balances per-token training FLOPs: embedding ~ free, recurrent layer ~ its matmul
FLOPs, head ~ hidden * vocab.
"""

from __future__ import annotations

from collections.abc import Callable

from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime.utils import partition_balanced

from app.common.logs import library_prints
from app.model.config import ModelConfig, head_flops_per_token, recurrent_flops_per_token
from app.model.layers import Embedding, Head, RecurrentLayer, tied_head_forward
from app.model.lm import DEFAULT_SEED, LanguageModel, seed_layer
from app.model.loss import token_loss
from app.parallel.layout import is_partition_method

PARTITION_METHODS = ("cost", "parameters", "uniform", "type:<regex>")
TIED_KEY = "embed"


def layer_specs(cfg: ModelConfig) -> list[LayerSpec]:
    """[embedding, recurrent x num_layers, head]; TiedLayerSpecs for embedding and head when tied."""
    if cfg.tie_embeddings:
        first = TiedLayerSpec(TIED_KEY, Embedding, cfg, tied_weight_attr="weight")
        last = TiedLayerSpec(
            TIED_KEY, Embedding, cfg, forward_fn=tied_head_forward, tied_weight_attr="weight"
        )
    else:
        first, last = LayerSpec(Embedding, cfg), LayerSpec(Head, cfg)
    return [first, *(LayerSpec(RecurrentLayer, cfg, i) for i in range(cfg.num_layers)), last]


def layer_costs(cfg: ModelConfig) -> list[float]:
    """Relative compute per layer of `layer_specs(cfg)` (forward matmul FLOPs per token)."""
    rec = [
        recurrent_flops_per_token(cfg.cell, cfg.embed_dim if i == 0 else cfg.hidden_dim, cfg.hidden_dim)
        for i in range(cfg.num_layers)
    ]
    return [0.0, *rec, head_flops_per_token(cfg)]


def build_sequential(cfg: ModelConfig, base_seed: int = DEFAULT_SEED) -> LanguageModel:
    """The same layers in one process (P = 1, ZeRO-2/3): the model's own module, seeded like the pipeline."""
    return LanguageModel(cfg, base_seed=base_seed)


class CostPipelineModule(PipelineModule):
    """PipelineModule that also understands partition_method="cost" (compute-balanced stages)."""

    def __init__(self, layers: list[LayerSpec], *, layer_costs: list[float], **kwargs) -> None:
        if len(layer_costs) != len(layers):
            raise ValueError(f"layer_costs has {len(layer_costs)} entries for {len(layers)} layers")
        # Set before PipelineModule.__init__, which partitions (calls _partition_layers) right away.
        self._layer_costs = list(layer_costs)
        super().__init__(layers, **kwargs)

    def _partition_layers(self, method: str = "uniform") -> None:
        if method.lower() != "cost":
            super()._partition_layers(method=method)
            return
        self.parts = [
            int(p) for p in partition_balanced(weights=self._layer_costs, num_parts=self.num_stages)
        ]
        stage_id = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])


def check_partition_method(method: str) -> None:
    if is_partition_method(method):
        return
    raise ValueError(f"partition_method must be one of {PARTITION_METHODS}, got {method!r}")


def build_pipeline(
    cfg: ModelConfig,
    num_stages: int | None = None,
    loss_fn: Callable = token_loss,
    partition_method: str = "cost",
    topology=None,
    base_seed: int = DEFAULT_SEED,
    activation_checkpoint_interval: int = 0,
    costs: list[float] | None = None,
) -> PipelineModule:
    """`layer_specs(cfg)` as a PipelineModule; needs torch.distributed initialised (deepspeed launcher).

    Give num_stages (data parallel = world / num_stages) or a DeepSpeed `topology`. `costs` (one per
    spec) replace the FLOP estimate that partition_method="cost" balances (see app.parallel.partition).
    """
    check_partition_method(partition_method)
    with library_prints():  # rank 0's "SEED_LAYERS=..." and "Using topology: ..." (our start-up line says it)
        return CostPipelineModule(
            layer_specs(cfg),
            layer_costs=layer_costs(cfg) if costs is None else costs,
            num_stages=num_stages,
            topology=topology,
            loss_fn=loss_fn,
            partition_method=partition_method,
            seed_layers=True,
            seed_fn=seed_layer,
            base_seed=base_seed,
            activation_checkpoint_interval=activation_checkpoint_interval,
            dynamic_shape=True,
        )
