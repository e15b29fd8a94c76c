"""`app/transfer.py` end to end: check every input, featurize (or read the cache), fit, plot, report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.checkpoints.export_format import feature_preprocess
from app.checkpoints.loader import Source, open_source
from app.classifier.spec import FEATURES, parse_layers
from app.common import outputs
from app.common.devices import resolve as resolve_device
from app.common.errors import UserError
from app.common.files import atomic_write
from app.common.logs import heartbeat
from app.probing.bounds import cap_counts, check_batches
from app.probing.config import TransferConfig
from app.probing.labelled import Classes, Labelled, classes_of, read_labelled
from app.probing.multilabel import MultiLabels, labels_of
from app.probing.splits import check_labels, split_train

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


OUT_FILES = ("transfer.json", "top_neuron_hist.png", "top_neuron_text.png")  # and features/, classifier/


def transfer_folder(cfg: TransferConfig, default: Path) -> Path:
    """--out (or `default`, beside the checkpoint) checked before any work: it holds no input, it can be
    written, and one that holds files we did not write is used through its subfolder transfer/."""
    reads = [("--checkpoint", cfg.checkpoint), ("--train", cfg.train), ("--test", cfg.test)]
    reads.append(("--validation", cfg.validation))
    done = ("transfer.json", "features", "classifier")  # a transfer folder from before the mark

    def earlier(p: Path) -> bool:
        return any((p / n).exists() for n in done)

    return outputs.output_folder("--out", cfg.out or default, reads, "transfer", earlier, _progress)


class Transfer:
    def __init__(self, cfg: TransferConfig) -> None:
        """Every input is read and checked here, before any featurizing."""
        require_extras()
        self.cfg = cfg
        self.src = open_source(cfg.checkpoint)
        self.tokenizer = self.src.tokenizer()
        self.train = read_labelled("train", cfg.train, cfg.text_field, cfg.label_field, say=_progress)
        self.multi = self.train.multi_label
        f = (self.train.text_field, cfg.label_field)  # the column --train's texts came from
        self.test = read_labelled("test", cfg.test, *f, multi=self.multi)
        self.val = (
            read_labelled("validation", cfg.validation, *f, multi=self.multi) if cfg.validation else None
        )
        self.classes: Classes | MultiLabels = (
            labels_of(self.train.labels, cfg.label_field, self.train.path, cfg.drop_rare_labels)
            if self.multi
            else classes_of(self.train)
        )
        sets = {"train": self.train, "test": self.test, **({"validation": self.val} if self.val else {})}
        self.y = {name: self.classes.encode(data, name) for name, data in sets.items()}
        if self.multi:  # every label on every side of the splits, or said (or refused) before featurising
            names = self.classes.names
            kept = check_labels(names, self.y, self.val is None, cfg.drop_rare_labels, _progress)
            if kept != names:
                self.classes = MultiLabels(kept, tuple(n for n in names if n not in kept))
                self.y = {name: self.classes.encode(data, name) for name, data in sets.items()}
        self.out = transfer_folder(cfg, default_out(self.src))  # app.common.outputs: before any work
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
        from app.classifier.features import token_ids
        from app.probing.features import checkpoint_digest

        digest = self.digest = checkpoint_digest(self.src.path)  # covers config.json's feature_preprocess
        preprocess = self.preprocess = feature_preprocess(self.src.path)
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
        return split_train(self.train.path, self.y["train"], self.cfg.val_fraction, self.cfg.seed)

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
            return ngram_baseline(*splits, self.cfg.seed, self.classes.names if self.multi else None)

    def _probe(self, feats: dict):
        """The probe of each feature kind tried; the validation accuracy (best over C; multi-label: macro F1)
        picks one (ties: the first in FEATURES order) -> (kind, its probe, its feature mean, scale,
        {kind: best validation figure})."""
        from app.probing.multilabel import fit_multilabel_probe
        from app.probing.probe import fit_probe

        c = self.cfg
        if self.multi:
            names = self.classes.names
            fits = {
                k: fit_multilabel_probe(*self._xy(feats, k), names, c.top_k, c.seed, k, _progress)
                for k in self.kinds
            }
            best_val = {k: f[0].val_macro_f1 for k, f in fits.items()}
        else:
            fits = {k: fit_probe(*self._xy(feats, k), c.top_k, c.seed, k, _progress) for k in self.kinds}
            best_val = {k: max(f[0].val_accuracy.values()) for k, f in fits.items()}
        kind = max(self.kinds, key=lambda k: (best_val[k], -self.kinds.index(k)))
        return kind, *fits[kind], best_val

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
            multi_label=self.multi,
        )
        n_classes = len(self.classes.names)
        train = (
            splits[0][0] if not c.finetune_max_tokens else [s[: c.finetune_max_tokens] for s in splits[0][0]]
        )
        check_batches(
            "fine-tuning on --train", train, c, model.cfg, max(self.layers) + 1, training=True, model=model
        )
        return fine_tune(model, splits, self.layers, n_classes, cfg, self.tokenizer.pad_id, log=_progress)

    def _plot_classes(self, probe) -> tuple[np.ndarray, list[str]]:
        """The test rows' classes the figures colour by: the classes, or (multi-label) with and without the
        label the top neuron weighs most."""
        if not self.multi:
            return self.y["test"], self.classes.names
        label = probe.single["label"]
        return self.y["test"][:, self.classes.names.index(label)], [f"not {label}", label]

    def _plots(
        self, model, feats: dict, kind: str, single: dict, y: np.ndarray, names: list[str]
    ) -> list[str]:
        from app.probing.features import neuron_trace
        from app.probing.plots import char_values, heatmap, histogram, histogram_title

        self.out.mkdir(parents=True, exist_ok=True)
        neuron, H = single["neuron"], model.cfg.hidden_dim
        layer, unit = self.layers[neuron // H], neuron % H  # layers side by side: H units each
        X = feats["test"][0].features[kind]
        acc = single["test_balanced_accuracy" if self.multi else "test_accuracy"]
        title = (
            histogram_title(kind, layer, unit, acc, self.multi)
            if acc is not None
            else f"{kind}, layer {layer}, unit {unit}"
        )
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

    def _single_label(self, probe, feats: dict, kind: str, best_val: dict) -> dict:
        """transfer.json's probe fields of a single-label task."""
        test = self._xy(feats, kind)[2]
        return {
            "val_accuracy_by_features": best_val,
            "classes": self.classes.names,
            "C": probe.C,
            "val_accuracy_by_C": {f"{k:g}": v for k, v in probe.val_accuracy.items()},
            "converged_by_C": {f"{k:g}": v for k, v in probe.converged_by_C.items()},
            "train_accuracy": probe.train_accuracy,
            "test_accuracy": probe.test_accuracy,
            "majority_class_test_accuracy": float(np.bincount(test[1]).max() / len(test[1])),
            "nonzero_weights": probe.nonzero,
            "top_neurons": probe.top,
            "single_neuron": probe.single,
            "converged": probe.converged,
        }

    def _keep(self, model, kind: str, probe, mean, scale, ft, chosen: dict | None) -> str | None:
        """Write the classifier the validation split chose to <out>/classifier -> its path (None: nothing
        was chosen, a --finetune-from-scratch control)."""
        from app.classifier.folder import write_classifier
        from app.probing.keep import finetune_head, probe_head

        if chosen is None:
            return None
        names = self.classes.names
        if chosen["method"] == "finetune":
            head = finetune_head(ft, self.layers, names, self.multi, self.cfg.finetune_max_tokens)
            lm_state, C = ft.classifier.lm.state_dict(), None
        else:
            head = probe_head(kind, self.layers, probe, mean, scale, names, self.multi)
            lm_state, C = model.state_dict(), probe.C_by_label if self.multi else probe.C
        metric = "macro_f1" if self.multi else "accuracy"
        about = {
            "C": C,
            "lm": {"source": self.src.describe(), "sha256": self.digest},
            "validation": {metric: chosen[f"val_{metric}"]},
            "test": {metric: chosen[f"test_{metric}"]},
        }
        tok_meta = {**self.tokenizer.meta(), **self.src.tokenizer_meta}
        folder = self.out / "classifier"
        return str(write_classifier(folder, self.src, tok_meta, lm_state, head, about, self.preprocess))

    def run(self) -> dict:
        from app.probing.multilabel import multi_label_result

        c = self.cfg
        device = self.device.type
        model = self.src.load_model(device)
        outputs.ensure_marked(self.out, "mlstm-transfer", OUT_FILES)
        feats = self.featurize_all(model)
        kind, probe, mean, scale, best_val = self._probe(feats)
        tr_idx, val_idx = self._split()
        split = None if val_idx is None else (len(tr_idx), len(val_idx))
        with heartbeat("figures: the top neuron's histogram and per-character trace", _progress):
            pngs = self._plots(model, feats, kind, probe.single, *self._plot_classes(probe))
        finetuned = self._finetune(model, feats)
        if self.multi:
            fields, probe_val, probe_test = multi_label_result(probe, self.y), probe.val_macro_f1, probe.test
            fields["val_macro_f1_by_features"], probe_test = best_val, probe_test["macro_f1"]
            fields["labels_dropped"] = list(self.classes.dropped)
        else:
            fields, probe_val = self._single_label(probe, feats, kind, best_val), best_val[kind]
            probe_test = probe.test_accuracy
        result = {
            "checkpoint": self.src.describe(),
            "task": "multi_label" if self.multi else "single_label",
            "features": kind,
            "features_asked": c.features,
            "layer": self.layers[0] if len(self.layers) == 1 else self.layers,
            "hidden_dim": self.src.model_cfg.hidden_dim,
            "rows": {k: len(v) for k, v in self.y.items()},
            "validation": c.validation
            or f"seeded split of --train (fraction {c.val_fraction}, seed {c.seed})",
            "train_val_rows": list(split) if split else None,
            **fields,
            "ngram_baseline": self._baseline(),
            "featurize": featurize_report(feats, self.kinds, device),
            "figures": pngs,
            **finetune_report(c, self.layers, finetuned, probe_val, probe_test, self.multi),
        }
        result["classifier"] = self._keep(model, kind, probe, mean, scale, finetuned, result["chosen"])
        atomic_write(self.out / "transfer.json", json.dumps(result, indent=1))
        return result


def featurize_report(feats: dict, kinds: tuple, device: str) -> dict:
    """transfer.json's "featurize": what reading the splits cost (from the cache: no seconds)."""
    fresh = [f for f, _ in feats.values() if not f.cached]
    secs, toks, texts = (
        sum(f.seconds for f in fresh),
        sum(f.tokens for f in fresh),
        sum(len(next(iter(f.features.values()))) for f in fresh),  # rows, not feature kinds
    )
    return {
        "cached": {k: f.cached for k, (f, _) in feats.items()},
        "texts": texts,
        "kinds": list(kinds),
        "tokens": toks,
        "seconds": secs,
        "texts_per_s": texts / secs if secs else None,
        "tokens_per_s": toks / secs if secs else None,
        "device": device,
    }


def finetune_report(
    cfg: TransferConfig, layers: list[int], ft, probe_val: float, probe_test: float, multi: bool = False
) -> dict:
    """transfer.json's "finetune" and "chosen": the validation accuracy (multi-label: macro F1) picks probe
    or fine-tuned (ties: the probe). A --finetune-from-scratch run is a control, not a candidate: its
    "chosen" is None."""
    from app.probing.finetune import HEAD_LR_SCALE

    m = "macro_f1" if multi else "accuracy"
    probe = {"method": "probe", f"val_{m}": probe_val, f"test_{m}": probe_test}
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
        f"val_{m}_by_epoch": ft.val_accuracy_by_epoch,
        "train_loss_by_epoch": ft.train_loss_by_epoch,
        "best_epoch": ft.best_epoch,
        f"val_{m}": ft.val_accuracy,
        f"train_{m}": ft.train_accuracy,
        f"test_{m}": ft.test_accuracy,
        **({"thresholds": [float(t) for t in ft.thresholds]} if multi else {}),
        "tokens": ft.tokens,
        "train_seconds": ft.seconds,
        "tokens_per_s": ft.tokens / ft.seconds if ft.seconds else None,
    }
    if cfg.finetune_from_scratch:
        return {"finetune": report, "chosen": None}
    tuned = {"method": "finetune", f"val_{m}": ft.val_accuracy, f"test_{m}": ft.test_accuracy}
    return {"finetune": report, "chosen": tuned if ft.val_accuracy > probe_val else probe}


def _progress(line: str) -> None:
    print(line, flush=True)


def _finetune_lines(result: dict) -> list[str]:
    ft, chosen = result["finetune"], result["chosen"]
    if ft is None:
        return []
    m = "macro_f1" if result["task"] == "multi_label" else "accuracy"
    what = "from a fresh initialisation (control)" if ft["from_scratch"] else "from the checkpoint"
    cut = f", {ft['texts_cut']} texts cut to {ft['max_tokens']} tokens" if ft["texts_cut"] else ""
    lines = [
        f"fine-tuned {what}, mean output of layer {ft['layer']}: best epoch {ft['best_epoch']} of "
        f"{ft['epochs']}, test {m.replace('_', ' ')} {ft[f'test_{m}']:.4f} ({ft['tokens_per_s'] or 0:,.0f} "
        f"tokens/s{cut})"
    ]
    if chosen is None:
        return [*lines, "picked on validation: nothing (a --finetune-from-scratch run is a control)"]
    return [
        *lines,
        f"picked on validation: {chosen['method']} (validation {chosen[f'val_{m}']:.4f}), "
        f"test {m.replace('_', ' ')} {chosen[f'test_{m}']:.4f}",
    ]


def _probe_lines(result: dict) -> list[str]:
    from app.probing.multilabel import summary_lines

    if result["task"] == "multi_label":
        return summary_lines(result)
    return [
        f"L1 logistic regression: C {result['C']:g}, test accuracy {result['test_accuracy']:.4f} "
        f"(majority class {result['majority_class_test_accuracy']:.4f}), {result['nonzero_weights']} "
        f"non-zero neurons{'' if result['converged'] else ' (solver did not fully converge)'}",
        f"n-gram baseline ({result['ngram_baseline']['model']}): test accuracy "
        f"{result['ngram_baseline']['test_accuracy']:.4f}",
    ]


def _single_figure(s: dict, multi: bool) -> str:
    """The single neuron's test figure: multi-label, balanced accuracy (its plain accuracy beside it, with
    the all-negative rate it is to be read against)."""
    if s["test_accuracy"] is None:
        return "test accuracy n/a"
    if not multi:
        return f"test accuracy {s['test_accuracy']:.4f}"
    return f"test balanced accuracy {s['test_balanced_accuracy']:.4f} (accuracy {s['test_accuracy']:.4f})"


def summary(result: dict, out: Path) -> str:
    s, f = result["single_neuron"], result["featurize"]
    speed = (
        f"{f['texts_per_s']:.1f} texts/s, {f['tokens_per_s']:,.0f} tokens/s" if f["seconds"] else "from cache"
    )
    multi = result["task"] == "multi_label"
    on = f" on label {s['label']}" if multi else ""
    kept = result["classifier"]
    return "\n".join(
        [
            result["checkpoint"],
            f"{'labels' if multi else 'classes'} {', '.join(result['labels' if multi else 'classes'])}; rows "
            f"{result['rows']}; features {result['features']} of layer {result['layer']} "
            f"({result['hidden_dim']} units); featurized {speed}",
            *_probe_lines(result),
            *_finetune_lines(result),
            f"single neuron {s['neuron']}{on}: {_single_figure(s, multi)}",
            f"top neurons: {', '.join(str(t['neuron']) for t in result['top_neurons'])}",
            f"classifier kept: {kept} (mlstm-classify --classifier {kept})"
            if kept
            else "classifier: none kept",
            f"written: {out / 'transfer.json'}, {', '.join(str(out / p) for p in result['figures'])}",
        ]
    )
