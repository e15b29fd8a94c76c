"""`app/transfer.py` end to end: check every input, featurize (or read the cache), fit, plot, report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.checkpoints.export_format import feature_preprocess
from app.checkpoints.loader import Source, open_source
from app.common.devices import resolve as resolve_device
from app.common.errors import UserError
from app.common.files import atomic_write
from app.common.logs import heartbeat
from app.probing.bounds import cap_counts, check_batches
from app.probing.config import FEATURES, TransferConfig, parse_layers
from app.probing.labelled import Classes, Labelled, classes_of, read_labelled

EXTRA_HINT = "pip install 'mlstm-ds[transfer]'  (or: pip install scikit-learn matplotlib)"


def require_extras() -> None:
    missing = []
    for mod, pkg in (("sklearn", "scikit-learn"), ("matplotlib", "matplotlib")):
        try:
            __import__(mod)
        except ImportError:
            missing.append(pkg)
    if missing:
        raise UserError(f"app/transfer.py needs {' and '.join(missing)}: {EXTRA_HINT}")


def default_out(src: Source) -> Path:
    if src.kind == "export":
        return src.path / "transfer"
    run = src.path.parent.parent if src.path.parent.name == "checkpoints" else src.path.parent
    return run / "transfer" / src.path.name


def _split_train(train: Labelled, y: np.ndarray, fraction: float, seed: int):
    """A seeded split of --train (index arrays), stratified so every class is on both sides when it can be,
    and always on the fitting side: a class of n rows gives the validation split at most n - 1 (a 2-row class
    at --val-fraction 0.75 keeps one; a 1-row class stays whole)."""
    rng = np.random.default_rng(seed)
    val = []
    for k in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == k))
        val.extend(rows[: min(round(fraction * len(rows)), len(rows) - 1)].tolist())
    val_idx = np.asarray(sorted(val), dtype=np.int64)
    tr_idx = np.setdiff1d(np.arange(len(y)), val_idx)
    if len(val_idx) == 0:
        raise UserError(
            f"--train {train.path}: too few rows to hold out a validation split; give --validation"
        )
    return tr_idx, val_idx


class Transfer:
    def __init__(self, cfg: TransferConfig) -> None:
        """Every input is read and checked here, before any featurizing."""
        require_extras()
        self.cfg = cfg
        self.src = open_source(cfg.checkpoint)
        self.tokenizer = self.src.tokenizer()
        self.train = read_labelled("train", cfg.train, cfg.text_field, cfg.label_field, say=_progress)
        f = (self.train.text_field, cfg.label_field)  # the column --train's texts came from
        self.test = read_labelled("test", cfg.test, *f)
        self.val = read_labelled("validation", cfg.validation, *f) if cfg.validation else None
        self.classes: Classes = classes_of(self.train)
        self.y = {
            "train": self.classes.encode(self.train, "train"),
            "test": self.classes.encode(self.test, "test"),
        }
        if self.val is not None:
            self.y["validation"] = self.classes.encode(self.val, "validation")
        self.out = Path(cfg.out) if cfg.out else default_out(self.src)
        try:
            self.layers = parse_layers(cfg.layer, self.src.model_cfg.num_layers)
        except ValueError as e:
            raise UserError(str(e)) from None
        self.kinds = FEATURES if cfg.features == "auto" else (cfg.features,)
        self.device = resolve_device(
            cfg.device, "--device", _progress
        )  # a GPU asked for and absent: one line
        width = self.src.model_cfg.hidden_dim * len(self.layers)
        cap_counts(cfg, width, {"train": len(self.train.texts), "test": len(self.test.texts)}, _progress)

    def _features(self, model, name: str, data: Labelled, ids: list, ckpt_digest: str):
        from app.probing.features import cache_path, cached_or_featurize, featurize_sets

        c = self.cfg
        paths = {
            k: cache_path(self.out / "features", ckpt_digest, data.sha256, data.text_field, k, self.layers)
            for k in self.kinds
        }
        pad = self.tokenizer.pad_id

        def compute():
            return featurize_sets(model, ids, self.layers, c.batch_tokens, pad, name)

        return cached_or_featurize(paths, len(ids), model.cfg.hidden_dim * len(self.layers), compute)

    def featurize_all(self, model) -> dict:
        """-> {split: (Featurized, token ids)} for train, test (and validation)."""
        from app.probing.features import checkpoint_digest, token_ids

        digest = checkpoint_digest(self.src.path)  # covers config.json's feature_preprocess
        preprocess = feature_preprocess(self.src.path)
        if preprocess != "none":
            _progress(f"texts prepared as feature_preprocess {preprocess!r} of {self.src.path} says")
        sets = {"train": self.train, "test": self.test, **({"validation": self.val} if self.val else {})}
        out = {}
        for name, data in sets.items():
            ids = token_ids(self.tokenizer, data.texts, preprocess)
            top = max(self.layers) + 1  # featurizing runs the layers up to the highest asked for
            check_batches(f"featurizing --{name}", ids, self.cfg, model.cfg, top, training=False, model=model)
            out[name] = (self._features(model, name, data, ids, digest), ids)
        return out

    def _split(self):
        """(train rows, validation rows) of --train, or (all of --train, None) when --validation is given."""
        if self.val is not None:
            return np.arange(len(self.train.texts)), None
        return _split_train(self.train, self.y["train"], self.cfg.val_fraction, self.cfg.seed)

    def _pairs(self, train, validation, test):
        """Per-split items (an array or a list, one per row of --train / --validation / --test) -> the
        (train, validation, test) (items, y) pairs every fit uses: --validation's rows, or the seeded split
        of --train's (validation is then ignored)."""
        tr_idx, val_idx = self._split()
        y, test_pair = self.y["train"], (test, self.y["test"])
        if val_idx is None:
            return (train, y), (validation, self.y["validation"]), test_pair

        def take(items, idx):
            return items[idx] if isinstance(items, np.ndarray) else [items[i] for i in idx]

        return (take(train, tr_idx), y[tr_idx]), (take(train, val_idx), y[val_idx]), test_pair

    def _xy(self, feats: dict, kind: str):
        """(train, validation, test) (X, y) pairs of one feature kind."""
        X = {k: f.features[kind] for k, (f, _) in feats.items()}
        return self._pairs(X["train"], X.get("validation"), X["test"])

    def _baseline(self) -> dict:
        from app.probing.ngram import ngram_baseline

        val_texts = self.val.texts if self.val is not None else None
        splits = self._pairs(self.train.texts, val_texts, self.test.texts)
        with heartbeat("n-gram baseline: tf-idf word 1-2 and char 2-5 grams, logistic regression", _progress):
            return ngram_baseline(*splits, self.cfg.seed)

    def _probe(self, feats: dict):
        """The probe of each feature kind tried; the validation accuracy (best over C) picks one (ties: the
        first in FEATURES order) -> (kind, its Probe, {kind: best validation accuracy})."""
        from app.probing.probe import fit_probe

        c = self.cfg
        probes = {k: fit_probe(*self._xy(feats, k), c.top_k, c.seed, k, _progress)[0] for k in self.kinds}
        best_val = {k: max(p.val_accuracy.values()) for k, p in probes.items()}
        kind = max(self.kinds, key=lambda k: (best_val[k], -self.kinds.index(k)))
        return kind, probes[kind], best_val

    def _finetune(self, model, feats: dict):
        """The fine-tuned classifier on the probe's splits (FineTuned), or None with --finetune-epochs 0."""
        from app.probing.finetune import FineTuneConfig, fine_tune

        c = self.cfg
        if c.finetune_epochs == 0:
            return None
        ids = {k: seqs for k, (_, seqs) in feats.items()}
        splits = self._pairs(ids["train"], ids.get("validation"), ids["test"])
        cfg = FineTuneConfig(
            epochs=c.finetune_epochs,
            lr=c.finetune_lr,
            rows=c.finetune_rows,
            batch_tokens=c.batch_tokens,
            max_tokens=c.finetune_max_tokens,
            seed=c.seed,
            from_scratch=c.finetune_from_scratch,
        )
        n_classes = len(self.classes.names)
        train = (
            splits[0][0] if not c.finetune_max_tokens else [s[: c.finetune_max_tokens] for s in splits[0][0]]
        )
        check_batches(
            "fine-tuning on --train", train, c, model.cfg, max(self.layers) + 1, training=True, model=model
        )
        return fine_tune(model, splits, self.layers, n_classes, cfg, self.tokenizer.pad_id, log=_progress)

    def _plots(self, model, feats: dict, kind: str, single: dict) -> list[str]:
        from app.probing.features import neuron_trace
        from app.probing.plots import char_values, heatmap, histogram, histogram_title

        self.out.mkdir(parents=True, exist_ok=True)
        neuron, H = single["neuron"], model.cfg.hidden_dim
        layer, unit = self.layers[neuron // H], neuron % H  # layers side by side: H units each
        names, X, y = self.classes.names, feats["test"][0].features[kind], self.y["test"]
        title = histogram_title(kind, layer, unit, single["test_accuracy"])
        histogram(self.out / "top_neuron_hist.png", X[:, neuron], y, names, neuron, title)
        files = ["top_neuron_hist.png"]
        # a few test texts, alternating classes so each colour story shows
        picks = [
            int(np.flatnonzero(y == k)[j])
            for j in range(len(y))
            for k in range(len(names))
            if (y == k).sum() > j
        ]
        picks = picks[: self.cfg.heatmap_texts]
        if picks:
            ids = feats["test"][1]
            drawn = []
            for i in picks:
                seq = ids[i][:800]
                trace = neuron_trace(model, seq, kind, layer, unit)
                drawn.append((*char_values(self.tokenizer, seq, trace), names[y[i]]))
            heatmap(self.out / "top_neuron_text.png", drawn, neuron)
            files.append("top_neuron_text.png")
        return files

    def run(self) -> dict:
        c = self.cfg
        device = self.device.type
        model = self.src.load_model(device)
        feats = self.featurize_all(model)
        kind, probe, best_val = self._probe(feats)
        test = self._xy(feats, kind)[2]
        tr_idx, val_idx = self._split()
        split = None if val_idx is None else (len(tr_idx), len(val_idx))
        with heartbeat("figures: the top neuron's histogram and per-character trace", _progress):
            pngs = self._plots(model, feats, kind, probe.single)
        finetuned = self._finetune(model, feats)
        fresh = [f for f, _ in feats.values() if not f.cached]
        secs, toks, texts = (
            sum(f.seconds for f in fresh),
            sum(f.tokens for f in fresh),
            sum(len(next(iter(f.features.values()))) for f in fresh),  # rows, not feature kinds
        )
        result = {
            "checkpoint": self.src.describe(),
            "features": kind,
            "features_asked": c.features,
            "val_accuracy_by_features": best_val,
            "layer": self.layers[0] if len(self.layers) == 1 else self.layers,
            "hidden_dim": self.src.model_cfg.hidden_dim,
            "classes": self.classes.names,
            "rows": {k: len(v) for k, v in self.y.items()},
            "validation": c.validation
            or f"seeded split of --train (fraction {c.val_fraction}, seed {c.seed})",
            "train_val_rows": list(split) if split else None,
            "C": probe.C,
            "val_accuracy_by_C": {f"{k:g}": v for k, v in probe.val_accuracy.items()},
            "converged_by_C": {f"{k:g}": v for k, v in probe.converged_by_C.items()},
            "train_accuracy": probe.train_accuracy,
            "test_accuracy": probe.test_accuracy,
            "majority_class_test_accuracy": float(np.bincount(test[1]).max() / len(test[1])),
            "nonzero_weights": probe.nonzero,
            "top_neurons": probe.top,
            "single_neuron": probe.single,
            "ngram_baseline": self._baseline(),
            "converged": probe.converged,
            "featurize": {
                "cached": {k: f.cached for k, (f, _) in feats.items()},
                "texts": texts,
                "kinds": list(self.kinds),
                "tokens": toks,
                "seconds": secs,
                "texts_per_s": texts / secs if secs else None,
                "tokens_per_s": toks / secs if secs else None,
                "device": device,
            },
            "figures": pngs,
            **finetune_report(c, self.layers, finetuned, best_val[kind], probe.test_accuracy),
        }
        atomic_write(self.out / "transfer.json", json.dumps(result, indent=1))
        return result


def finetune_report(cfg: TransferConfig, layers: list[int], ft, probe_val: float, probe_test: float) -> dict:
    """transfer.json's "finetune" and "chosen": the validation accuracy picks probe or fine-tuned (ties: the
    probe). A --finetune-from-scratch run is a control, not a candidate: its "chosen" is None."""
    from app.probing.finetune import HEAD_LR_SCALE

    probe = {"method": "probe", "val_accuracy": probe_val, "test_accuracy": probe_test}
    if ft is None:
        return {"finetune": None, "chosen": probe}
    report = {
        "layer": layers[0] if len(layers) == 1 else layers,
        "features": "mean_hidden",
        "from_scratch": cfg.finetune_from_scratch,
        "epochs": cfg.finetune_epochs,
        "lr": cfg.finetune_lr,
        "head_lr": HEAD_LR_SCALE * cfg.finetune_lr,
        "rows": cfg.finetune_rows,
        "max_tokens": cfg.finetune_max_tokens,
        "texts_cut": ft.truncated,
        "val_accuracy_by_epoch": ft.val_accuracy_by_epoch,
        "train_loss_by_epoch": ft.train_loss_by_epoch,
        "best_epoch": ft.best_epoch,
        "val_accuracy": ft.val_accuracy,
        "train_accuracy": ft.train_accuracy,
        "test_accuracy": ft.test_accuracy,
        "tokens": ft.tokens,
        "train_seconds": ft.seconds,
        "tokens_per_s": ft.tokens / ft.seconds if ft.seconds else None,
    }
    if cfg.finetune_from_scratch:
        return {"finetune": report, "chosen": None}
    tuned = {"method": "finetune", "val_accuracy": ft.val_accuracy, "test_accuracy": ft.test_accuracy}
    return {"finetune": report, "chosen": tuned if ft.val_accuracy > probe_val else probe}


def _progress(line: str) -> None:
    print(line, flush=True)


def _finetune_lines(result: dict) -> list[str]:
    ft, chosen = result["finetune"], result["chosen"]
    if ft is None:
        return []
    what = "from a fresh initialisation (control)" if ft["from_scratch"] else "from the checkpoint"
    cut = f", {ft['texts_cut']} texts cut to {ft['max_tokens']} tokens" if ft["texts_cut"] else ""
    lines = [
        f"fine-tuned {what}, mean output of layer {ft['layer']}: best epoch {ft['best_epoch']} of "
        f"{ft['epochs']}, test accuracy {ft['test_accuracy']:.4f} ({ft['tokens_per_s'] or 0:,.0f} tokens/s{cut})"
    ]
    if chosen is None:
        return [*lines, "picked on validation: nothing (a --finetune-from-scratch run is a control)"]
    return [
        *lines,
        f"picked on validation: {chosen['method']} (validation {chosen['val_accuracy']:.4f}), "
        f"test accuracy {chosen['test_accuracy']:.4f}",
    ]


def summary(result: dict, out: Path) -> str:
    s, f = result["single_neuron"], result["featurize"]
    speed = (
        f"{f['texts_per_s']:.1f} texts/s, {f['tokens_per_s']:,.0f} tokens/s" if f["seconds"] else "from cache"
    )
    return "\n".join(
        [
            result["checkpoint"],
            f"classes {', '.join(result['classes'])}; rows {result['rows']}; features {result['features']} "
            f"of layer {result['layer']} ({result['hidden_dim']} units); featurized {speed}",
            f"L1 logistic regression: C {result['C']:g}, test accuracy {result['test_accuracy']:.4f} "
            f"(majority class {result['majority_class_test_accuracy']:.4f}), {result['nonzero_weights']} "
            f"non-zero neurons{'' if result['converged'] else ' (solver did not fully converge)'}",
            f"n-gram baseline ({result['ngram_baseline']['model']}): test accuracy "
            f"{result['ngram_baseline']['test_accuracy']:.4f}",
            *_finetune_lines(result),
            f"single neuron {s['neuron']}: test accuracy {s['test_accuracy']:.4f}",
            f"top neurons: {', '.join(str(t['neuron']) for t in result['top_neurons'])}",
            f"written: {out / 'transfer.json'}, {', '.join(str(out / p) for p in result['figures'])}",
        ]
    )
