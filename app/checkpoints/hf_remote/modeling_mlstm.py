"""Multiplicative LSTM language model (Krause et al. 2016) for `transformers`, exported by mlstm-ds.

Not xLSTM's matrix-memory mLSTM: this is the 2016 cell with a multiplicative intermediate state,
per layer and time step (x input, h/c state):

    m_t = (W_mx x_t) * (W_mh h_{t-1})
    [i, f, o, u] = W_x x_t + W_m m_t + b
    c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(u)
    h_t = sigmoid(o) * tanh(c_t)

Plain torch: this file runs from transformers' module cache and imports nothing of mlstm-ds. Its
state-dict keys are mlstm-ds's own ("{i}.{name}": "0" embedding, "1".."L" recurrent layers, "L+1" the
untied head), so the same model.safetensors loads in both. Weight normalisation (w = g * v / ||v|| per
row) is computed from the stored v and g, as in training, so logits match and fine-tuning keeps its
parametrisation.

Generation carries the recurrent state: the cache is (h, c) per layer (plus, without autograd, the
normalised matrices of its first call), so the prompt is read once and each new token costs one
recurrent step. Positions whose attention_mask is 0 leave the state as it was,
so a left-padded batch gives every row what it gets alone.

MultiplicativeLSTMForSequenceClassification is a classifier folder's model (mlstm-ds's app/transfer.py
keeps one, app/classify.py reads it): the language model's layers, then the head the folder was kept with,
on the features it was fitted on (the final cell or hidden state, or the layer output's mean or max over
the text's real tokens, of the listed layers side by side), standardised ((x - mean) / scale) and times
the head's weights. Its logits give the same labels and probabilities as app/classify.py: softmax over
the classes (a two-class probe's one logit z is given as [0, z]), or a sigmoid per label for a
multi-label classifier, whose thresholds are config.classifier_thresholds.

transformers >= 5.3, < 6: from 5.24 the cache goes in and out as `cache` (forward's argument, the output
field); before, as `past_key_values`. forward takes either name, and the output uses the field this
transformers has (5.24 still reads `output.past_key_values`, with a deprecation warning).
"""

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast, SequenceClassifierOutput

from .configuration_mlstm import MultiplicativeLSTMConfig

# the output field generation reads the cache back from: `cache` from transformers 5.24, before it
# `past_key_values`
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class MultiplicativeLSTMCache:
    """The recurrent state after the tokens read so far: per layer (h, c), each (B, H).

    Without autograd it also keeps each layer's weight-normalised matrices from its first call, so a new
    token costs one recurrent step and no renormalisation (a cache belongs to one set of weights).
    """

    is_compileable = False
    is_croppable = False  # a recurrent state cannot forget its last tokens

    @property
    def is_linear(self):
        """transformers >= 5.24 reads this before a prefill: False for every layer, so that, as with a
        KV cache (and as transformers < 5.24 does for any cache), generate() given this cache and the whole
        sequence so far feeds forward only the tokens after the `get_seq_length()` the state holds.
        (True would feed the whole sequence again into a state that has read most of it already.)"""
        return [False] * len(self.states)

    def __init__(self, states, seen_tokens=0):
        self.states = list(states)
        self.seen_tokens = seen_tokens
        self.weights = None  # per layer (w_in, w_mh, w_m), or None for an LSTM layer

    def get_seq_length(self, layer_idx=0):
        return self.seen_tokens

    def reorder_cache(self, beam_idx):
        """Beam search: row b takes the state of row beam_idx[b]."""
        self.states = [
            (h.index_select(0, beam_idx.to(h.device)), c.index_select(0, beam_idx.to(c.device)))
            for h, c in self.states
        ]

    def batch_repeat_interleave(self, repeats):
        self.states = [
            (h.repeat_interleave(repeats, 0), c.repeat_interleave(repeats, 0)) for h, c in self.states
        ]

    def batch_select_indices(self, indices):
        self.states = [(h[indices], c[indices]) for h, c in self.states]


def _weight_normed(v, g):
    """v (out, in), g (out,) -> w = g * v / ||v|| per row (out, in)."""
    return v * (g / v.norm(dim=1)).unsqueeze(1)


def _state_dtype(dtype):
    """Gates and cell state stay at least float32 (bf16/fp16 weights: only the products are 16-bit)."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


class MultiplicativeLSTMLayer(nn.Module):
    """One recurrent layer: x (B, T, in) from state (h, c) -> (y (B, T, H), state after T steps)."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.cell = config.cell
        in_dim = config.embed_dim if layer_idx == 0 else config.hidden_dim
        self.hidden_dim = H = config.hidden_dim
        self.residual = config.residual and in_dim == H
        self.weight_norm = config.weight_norm and config.cell == "mlstm"
        self.drop = nn.Dropout(config.dropout)
        self.forget_bias = config.forget_bias
        self.init_range = config.init_range or 1.0 / math.sqrt(H)
        if self.cell == "lstm":
            self.lstm = nn.LSTM(in_dim, H, batch_first=True)
            return
        # rows of weight_in: [W_mx (H); W_x (4H) in gate order i, f, o, u]
        self.weight_in = nn.Parameter(torch.empty(5 * H, in_dim))
        self.weight_mh = nn.Parameter(torch.empty(H, H))
        self.weight_m = nn.Parameter(torch.empty(4 * H, H))
        self.bias = nn.Parameter(torch.zeros(4 * H))
        if self.weight_norm:
            self.gain_in = nn.Parameter(torch.ones(5 * H))
            self.gain_mh = nn.Parameter(torch.ones(H))
            self.gain_m = nn.Parameter(torch.ones(4 * H))

    @torch.no_grad()
    def reset_parameters(self):
        """mlstm-ds's initialisation (uniform +-r, forget-gate bias, gains = row norms)."""
        r, H = self.init_range, self.hidden_dim
        if self.cell == "lstm":
            for p in self.lstm.parameters():
                p.uniform_(-r, r)
            self.lstm.bias_ih_l0[H : 2 * H].fill_(self.forget_bias)  # nn.LSTM gate order i, f, g, o
            self.lstm.bias_hh_l0[H : 2 * H].zero_()
            return
        for w in (self.weight_in, self.weight_mh, self.weight_m):
            w.uniform_(-r, r)
        self.bias.zero_()
        self.bias[H : 2 * H].fill_(self.forget_bias)
        if self.weight_norm:
            self.gain_in.copy_(self.weight_in.norm(dim=1))
            self.gain_mh.copy_(self.weight_mh.norm(dim=1))
            self.gain_m.copy_(self.weight_m.norm(dim=1))

    def weights(self):
        """Effective (w_in, w_mh, w_m), weight-normalised (once per forward or per generation, not per step)."""
        if not self.weight_norm:
            return self.weight_in, self.weight_mh, self.weight_m
        pairs = ((self.weight_in, self.gain_in), (self.weight_mh, self.gain_mh), (self.weight_m, self.gain_m))
        return tuple(_weight_normed(v, g) for v, g in pairs)

    def init_state(self, batch, device, dtype):
        z = torch.zeros(batch, self.hidden_dim, device=device, dtype=_state_dtype(dtype))
        return z, z.clone()

    def forward(self, x, state, mask=None, weights=None):
        """x (B, T, in), state (h, c) each (B, H), mask (B, T) bool or None (all real); `weights`:
        this layer's `weights()` computed by the caller (generation keeps them for every step)."""
        if self.cell == "lstm":
            y, state = self._lstm(x, state, mask)
        else:
            y, state = self._mlstm(x, state, mask, weights or self.weights())
        y = self.drop(y)
        if self.residual:
            y = y + x
        return y, state

    def _mlstm(self, x, state, mask, weights):
        H, T = self.hidden_dim, x.shape[1]
        w_in, w_mh, w_m = weights
        sdt = _state_dtype(x.dtype)
        proj = F.linear(x, w_in).to(sdt)  # (B, T, 5H): the input side of every step in one product
        pm, pg = proj[..., :H], proj[..., H:] + self.bias.to(sdt)  # (B, T, H) W_mx x, (B, T, 4H) W_x x + b
        h, c = state
        ys = []
        for t in range(T):
            m = pm[:, t] * F.linear(h.to(w_mh.dtype), w_mh).to(sdt)  # (B, H) m_t
            g = pg[:, t] + F.linear(m.to(w_m.dtype), w_m).to(sdt)  # (B, 4H) pre-activations
            i, f, o, u = g.chunk(4, dim=1)
            c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)  # (B, H)
            h_new = torch.sigmoid(o) * torch.tanh(c_new)  # (B, H)
            if mask is not None:  # a pad position leaves the state as it was
                keep = mask[:, t, None]  # (B, 1)
                h_new, c_new = torch.where(keep, h_new, h), torch.where(keep, c_new, c)
            h, c = h_new, c_new
            ys.append(h)
        y = torch.stack(ys, dim=1) if ys else x.new_zeros(x.shape[0], 0, H)  # (B, T, H)
        return y.to(x.dtype), (h, c)

    def _lstm(self, x, state, mask):
        h, c = (s.to(x.dtype).unsqueeze(0) for s in state)  # (1, B, H)
        if mask is None or bool(mask.all()):
            y, (h, c) = self.lstm(x, (h, c))  # (B, T, H)
            return y, (h[0], c[0])
        ys = []
        for t in range(x.shape[1]):  # padded rows: step by step so pads leave the state alone
            _, (h_new, c_new) = self.lstm(x[:, t : t + 1], (h, c))  # (B, 1, H)
            keep = mask[None, :, t, None]  # (1, B, 1)
            h, c = torch.where(keep, h_new, h), torch.where(keep, c_new, c)
            ys.append(h[0])
        return torch.stack(ys, dim=1), (h[0], c[0])


class MultiplicativeLSTMPreTrainedModel(PreTrainedModel):
    config_class = MultiplicativeLSTMConfig
    base_model_prefix = "mlstm"  # no such child: the keys are "{i}.{name}" at the top level
    main_input_name = "input_ids"
    _no_split_modules: ClassVar[list] = ["MultiplicativeLSTMLayer"]
    supports_gradient_checkpointing = False
    _is_stateful = True  # a recurrent state cannot roll back: no assisted generation

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.embed_init_std
        if isinstance(module, MultiplicativeLSTMLayer):
            module.reset_parameters()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
        elif isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, ClassifierHead):
            module.reset_parameters(std)


class MultiplicativeLSTMForCausalLM(MultiplicativeLSTMPreTrainedModel, GenerationMixin):
    """forward(input_ids (B, T)) -> logits (B, T, V); generate() carries the recurrent state."""

    def __init__(self, config):
        super().__init__(config)
        L = config.num_layers
        self.add_module("0", nn.Embedding(config.vocab_size, config.embed_dim))
        for i in range(L):
            self.add_module(str(i + 1), MultiplicativeLSTMLayer(config, i))
        if not config.tie_embeddings:
            self.add_module(str(L + 1), nn.Linear(config.hidden_dim, config.vocab_size))
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # the cache is the recurrent state, built by forward (MultiplicativeLSTMCache)

    @property
    def layers(self):
        return [getattr(self, str(i + 1)) for i in range(self.config.num_layers)]

    def get_input_embeddings(self):
        return getattr(self, "0")

    def set_input_embeddings(self, value):
        self.add_module("0", value)

    def get_output_embeddings(self):
        return None if self.config.tie_embeddings else getattr(self, str(self.config.num_layers + 1))

    def head(self, h):
        """(..., H) -> (..., V) logits."""
        if self.config.tie_embeddings:
            return F.linear(h, self.get_input_embeddings().weight)
        return self.get_output_embeddings()(h)

    def _start_cache(self, cache, batch, x):
        """Our cache, or a fresh zero state (also in place of an empty generic cache from transformers)."""
        if isinstance(cache, MultiplicativeLSTMCache):
            return cache
        if cache is not None and cache.get_seq_length() > 0:
            raise ValueError(
                "cache must be a MultiplicativeLSTMCache (the recurrent state) returned by this model"
            )
        return MultiplicativeLSTMCache([layer.init_state(batch, x.device, x.dtype) for layer in self.layers])

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        cache=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_hidden_states=None,
        return_dict=None,
        logits_to_keep=0,
        past_key_values=None,
        **kwargs,
    ):
        """Reads the tokens from `cache`'s state (zero when None) and returns the state after them.

        past_key_values: the name transformers < 5.24 passes the cache by (either name; not both).

        attention_mask (B, past + T): 0 marks padding (left padding in batched generation).
        logits_to_keep: k > 0 computes the head on the last k positions only (generation keeps 1).
        """
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
        x = inputs_embeds  # (B, T, E)
        B, T = x.shape[:2]
        if cache is not None and past_key_values is not None:
            raise ValueError("pass the cache as `cache` or as `past_key_values`, not both")
        cache = self._start_cache(cache if cache is not None else past_key_values, B, x)
        mask = None
        if attention_mask is not None:
            mask = attention_mask[:, -T:].to(device=x.device, dtype=torch.bool)  # (B, T) this call's tokens
            mask = None if bool(mask.all()) else mask
        hidden = [x] if output_hidden_states else None
        weights = cache.weights
        if weights is None or torch.is_grad_enabled():
            weights = [layer.weights() if layer.cell == "mlstm" else None for layer in self.layers]
            cache.weights = None if torch.is_grad_enabled() else weights
        states = []
        for layer, state, w in zip(self.layers, cache.states, weights):
            x, state = layer(x, state, mask, w)  # (B, T, H)
            states.append(state)
            if hidden is not None:
                hidden.append(x)
        if use_cache is None:
            use_cache = self.config.use_cache
        if use_cache:
            cache.states, cache.seen_tokens = states, cache.seen_tokens + T
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.head(x)  # (B, T or k, V)
        logits = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
        loss = None
        if labels is not None:  # next-token loss: position t predicts labels[t + 1]; -100 is ignored
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1).to(logits.device),
                ignore_index=-100,
            )
        out = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=tuple(hidden) if hidden is not None else None,
            **{_CACHE_FIELD: cache if use_cache else None},
        )
        return out if return_dict is not False else out.to_tuple()


class ClassifierHead(nn.Module):
    """Standardised features times the kept weights: ((x - mean) / scale) W^T + b."""

    def __init__(self, width, outputs):
        super().__init__()
        self.mean = nn.Parameter(torch.zeros(width))
        self.scale = nn.Parameter(torch.ones(width))
        self.weight = nn.Parameter(torch.zeros(outputs, width))
        self.bias = nn.Parameter(torch.zeros(outputs))

    @torch.no_grad()
    def reset_parameters(self, std):
        self.mean.zero_()
        self.scale.fill_(1.0)
        self.weight.normal_(0.0, std)
        self.bias.zero_()

    def forward(self, features):
        x = (features - self.mean.to(features.dtype)) / self.scale.to(features.dtype)
        return F.linear(x, self.weight.to(x.dtype), self.bias.to(x.dtype))


def _pooled_features(kind, y, state, mask):
    """One layer's feature `kind`: y (B, T, H) its outputs, state (h, c) after each row's last real token,
    mask (B, T) bool (the real tokens)."""
    if kind == "final_cell":
        return state[1]
    if kind == "final_hidden":
        return state[0]
    m = mask[..., None]  # (B, T, 1)
    if kind == "mean_hidden":
        return (y * m.to(y.dtype)).sum(1) / m.sum(1).clamp(min=1).to(y.dtype)
    if kind == "max_hidden":
        return y.masked_fill(~m, float("-inf")).amax(1)
    raise ValueError(
        f"classifier_features must be final_cell, final_hidden, mean_hidden or max_hidden, got {kind!r}"
    )


class MultiplicativeLSTMForSequenceClassification(MultiplicativeLSTMPreTrainedModel):
    """forward(input_ids (B, T), attention_mask) -> logits (B, labels); left or right padding alike."""

    def __init__(self, config):
        super().__init__(config)
        L = config.num_layers
        self.add_module("0", nn.Embedding(config.vocab_size, config.embed_dim))
        for i in range(L):
            self.add_module(str(i + 1), MultiplicativeLSTMLayer(config, i))
        if not config.tie_embeddings:  # the language model's head: kept in the folder, not read here
            self.add_module(str(L + 1), nn.Linear(config.hidden_dim, config.vocab_size))
        self.read_layers = [int(i) for i in config.classifier_layers]
        outputs = config.classifier_outputs or config.num_labels
        self.classifier = ClassifierHead(config.hidden_dim * len(self.read_layers), outputs)
        self.post_init()

    def get_input_embeddings(self):
        return getattr(self, "0")

    def set_input_embeddings(self, value):
        self.add_module("0", value)

    def features(self, input_ids=None, attention_mask=None, inputs_embeds=None):
        """(B, H * len(layers)): the classifier's features of each row's real tokens (the first
        config.classifier_max_tokens of them when that is set)."""
        x = self.get_input_embeddings()(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, E)
        B, T = x.shape[:2]
        mask = torch.ones(B, T, dtype=torch.bool, device=x.device)
        if attention_mask is not None:
            mask = attention_mask.to(device=x.device, dtype=torch.bool)
        if self.config.classifier_max_tokens:
            mask = mask & (mask.long().cumsum(1) <= self.config.classifier_max_tokens)
        step_mask = None if bool(mask.all()) else mask
        out = {}
        for i in range(max(self.read_layers) + 1):
            layer = getattr(self, str(i + 1))
            x, state = layer(x, layer.init_state(B, x.device, x.dtype), step_mask)  # (B, T, H)
            if i in self.read_layers:
                out[i] = _pooled_features(self.config.classifier_features, x, state, mask)
        return torch.cat([out[i] for i in self.read_layers], dim=1)

    def forward(
        self, input_ids=None, attention_mask=None, inputs_embeds=None, labels=None, return_dict=None, **kwargs
    ):
        z = self.classifier(self.features(input_ids, attention_mask, inputs_embeds))  # (B, outputs)
        multi = self.config.problem_type == "multi_label_classification"
        logits = torch.cat([torch.zeros_like(z), z], dim=1) if z.shape[1] == 1 and not multi else z
        loss = None
        if labels is not None:
            labels = labels.to(logits.device)
            if multi:
                loss = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
            else:
                loss = F.cross_entropy(logits, labels)
        out = SequenceClassifierOutput(loss=loss, logits=logits)
        return out if return_dict is not False else out.to_tuple()
