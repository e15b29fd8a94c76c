"""app/probing/finetune.py: fine-tuning the LM with a linear head beside the probe (app/transfer.py).

The pooled features of the training path are checked against the inference path's mean_hidden in float64 on
fresh random weights and texts; the fine-tuning itself on the separable tiny task of tests/test_transfer.py
(letters against digits), through the real CLI.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from test_transfer import run_transfer, task  # noqa: F401  (the fixture)

from app.classifier.features import batch_feature_sets, length_batches, pooled
from app.model.config import debug_config
from app.model.lm import LanguageModel
from app.probing.config import TransferConfig
from app.probing.finetune import FineTuneConfig, FineTuned, fine_tune
from app.probing.run import finetune_report
from app.transfer import main as transfer_main


@pytest.mark.parametrize("cell", ["mlstm", "lstm"])
def test_pooled_training_path_equals_the_inference_mean_and_ignores_pads(cell):
    torch.manual_seed(random.randrange(1 << 30))
    model = (
        LanguageModel(debug_config(vocab_size=259, cell=cell, weight_norm=cell == "mlstm")).double().eval()
    )
    lengths = torch.tensor([9, 3, 14, 1])
    ids = torch.randint(0, 256, (4, 14))
    ref = batch_feature_sets(model, ids, lengths, [1, 0])["mean_hidden"]  # prefill path, (4, 2H)
    with torch.no_grad():
        got = pooled(model, ids, lengths, [1, 0])
        padded = pooled(model, torch.cat([ids, torch.randint(0, 256, (4, 5))], 1), lengths, [1, 0])
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(padded, ref, rtol=1e-12, atol=1e-12)  # what follows a text never reaches it


def test_pooled_gradient_matches_finite_differences():
    torch.manual_seed(random.randrange(1 << 30))
    model = LanguageModel(debug_config(vocab_size=259)).double().train()
    ids, lengths = torch.randint(0, 256, (2, 6)), torch.tensor([6, 4])
    w = model.recurrent[0].bias
    out = pooled(model, ids, lengths, [1]).sum()
    (grad,) = torch.autograd.grad(out, w)
    eps, i = 1e-6, int(torch.randint(0, w.numel(), ()))
    with torch.no_grad():
        w.view(-1)[i] += eps
        up = pooled(model, ids, lengths, [1]).sum()
        w.view(-1)[i] -= 2 * eps
        down = pooled(model, ids, lengths, [1]).sum()
        w.view(-1)[i] += eps
    assert float(grad.view(-1)[i]) == pytest.approx(float(up - down) / (2 * eps), rel=1e-5, abs=1e-9)


def test_length_batches_honour_the_row_cap_and_a_jittered_order():
    rng = np.random.default_rng(random.randrange(1 << 30))
    lengths = rng.integers(1, 40, 200)
    key = lengths + rng.uniform(0, 4, len(lengths))
    batches = length_batches(lengths, 60, max_rows=3, sort_key=key)
    assert np.concatenate(batches).tolist() == np.argsort(key, kind="stable").tolist()  # the key's order
    for k, b in enumerate(batches):
        assert len(b) <= 3 and (len(b) == 1 or len(b) * lengths[b].max() <= 60)
        if k + 1 < len(batches):  # cut only when the next text would break a limit
            grown = np.concatenate([b, batches[k + 1][:1]])
            assert len(grown) > 3 or len(grown) * lengths[grown].max() > 60
    # a longer text before a shorter one: the padded size is the longest so far (2 x 10 > 19), not the next
    assert [b.tolist() for b in length_batches(np.asarray([10, 9]), 19, sort_key=np.asarray([1, 2]))] == [
        [0],
        [1],
    ]


def separable(rng: np.random.Generator, n: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Class 0: bytes 97..104; class 1: bytes 48..57; lengths 3..20, BOS first."""
    y = rng.integers(0, 2, n)
    seqs = [
        np.asarray([257, *rng.integers(*((97, 105) if k == 0 else (48, 58)), rng.integers(3, 21))]) for k in y
    ]
    return seqs, y


def test_fine_tune_learns_keeps_the_best_epoch_and_leaves_the_model():
    rng = np.random.default_rng(random.randrange(1 << 30))
    torch.manual_seed(0)
    model = LanguageModel(debug_config(vocab_size=259)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    splits = (separable(rng, 96), separable(rng, 32), separable(rng, 32))
    cfg = FineTuneConfig(
        epochs=3, lr=3e-3, rows=16, batch_tokens=4096, max_tokens=0, seed=0, from_scratch=False
    )
    lines: list[str] = []
    ft = fine_tune(model, splits, [1], 2, cfg, pad_id=258, log=lines.append)
    assert len(ft.val_accuracy_by_epoch) == 3 == len(lines) - 1 and "epoch 3/3" in lines[-2]
    assert lines[-1].startswith("fine-tune: the best epoch (")  # the last phase says it has begun
    assert ft.best_epoch == 1 + int(np.argmax(ft.val_accuracy_by_epoch))
    assert ft.test_accuracy > 0.8 and ft.train_accuracy > 0.8
    assert (ft.test_pred == splits[2][1]).mean() == ft.test_accuracy
    assert ft.tokens == 3 * sum(len(s) for s in splits[0][0])
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_transfer_reports_fine_tuning_and_picks_on_validation(task):  # noqa: F811
    res = run_transfer(task, "--finetune-epochs", "3", "--finetune-lr", "3e-3", "--finetune-rows", "8")
    ft, chosen = res["finetune"], res["chosen"]
    assert len(ft["val_accuracy_by_epoch"]) == 3 and ft["from_scratch"] is False and ft["layer"] == 1
    assert ft["test_accuracy"] > res["majority_class_test_accuracy"] + 0.3 and ft["tokens_per_s"] > 0
    probe_val = res["val_accuracy_by_features"][res["features"]]
    best = max(ft["val_accuracy_by_epoch"])
    assert chosen["method"] == ("finetune" if best > probe_val else "probe")
    want = ft["test_accuracy"] if chosen["method"] == "finetune" else res["test_accuracy"]
    assert chosen["test_accuracy"] == want
    scratch = run_transfer(task, "--finetune-epochs", "1", "--finetune-from-scratch")
    assert (
        scratch["finetune"]["from_scratch"] is True and len(scratch["finetune"]["val_accuracy_by_epoch"]) == 1
    )
    assert scratch["chosen"] is None
    off = run_transfer(task, "--finetune-epochs", "0")
    assert off["finetune"] is None and off["chosen"]["method"] == "probe"
    assert off["chosen"]["test_accuracy"] == off["test_accuracy"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--finetune-epochs", "-1"], "--finetune-epochs"),
        (["--finetune-lr", "0"], "--finetune-lr must be > 0"),
        (["--finetune-rows", "0"], "--finetune-rows must be >= 1"),
        (["--finetune-max-tokens", "-5"], "--finetune-max-tokens"),
        (["--finetune-epochs", "0", "--finetune-from-scratch"], "needs --finetune-epochs >= 1"),
    ],
)
def test_bad_fine_tuning_flags_are_one_clear_line(task, capsys, args, needle):  # noqa: F811
    base = ["--checkpoint", str(task / "run"), "--train", str(task / "train.csv")]
    rc = transfer_main([*base, "--test", str(task / "test.jsonl"), "--out", str(task / "out"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err
    assert not (task / "out" / "transfer.json").exists()


@pytest.mark.parametrize(("ft_val", "method"), [(0.75, "finetune"), (0.6, "probe"), (0.5, "probe")])
def test_validation_picks_the_method_and_a_tie_keeps_the_probe(ft_val, method):
    cfg = TransferConfig(checkpoint="c", train="a.csv", test="b.csv")
    ft = FineTuned([0.5, ft_val], [0.7, 0.6], 2, ft_val, 0.9, 0.8, np.zeros(3, dtype=np.int64), 100, 2.0, 0)
    got = finetune_report(cfg, [1], ft, 0.6, 0.65)
    want_test = 0.8 if method == "finetune" else 0.65
    assert got["chosen"] == {"method": method, "val_accuracy": max(ft_val, 0.6), "test_accuracy": want_test}
    assert got["finetune"]["best_epoch"] == 2 and got["finetune"]["tokens_per_s"] == 50.0
    control = TransferConfig(checkpoint="c", train="a.csv", test="b.csv", finetune_from_scratch=True)
    assert finetune_report(control, [1], ft, 0.6, 0.65)["chosen"] is None  # a control is never picked


def test_the_best_epoch_is_restored_when_a_later_one_is_worse():
    """Labels the texts do not determine and a large step: validation accuracy goes up and down, and the
    weights that score test are the best epoch's (their validation accuracy, measured again, matches)."""
    cfg = FineTuneConfig(
        epochs=5, lr=3e-2, rows=8, batch_tokens=4096, max_tokens=0, seed=0, from_scratch=False
    )
    torch.manual_seed(0)
    model = LanguageModel(debug_config(vocab_size=259)).eval()
    restored_earlier = 0
    for seed in range(4):
        rng = np.random.default_rng(seed)
        splits = [separable(rng, n) for n in (48, 24, 24)]
        noisy = [(seqs, rng.integers(0, 2, len(y))) for seqs, y in splits]
        ft = fine_tune(model, tuple(noisy), [1], 2, cfg, pad_id=258)
        assert ft.val_accuracy == ft.val_accuracy_by_epoch[ft.best_epoch - 1]
        restored_earlier += ft.best_epoch < cfg.epochs and ft.val_accuracy > ft.val_accuracy_by_epoch[-1]
    assert restored_earlier  # the check above covered a best epoch before a worse last one


def test_from_scratch_ignores_the_weights_and_the_input_model_is_untouched_in_bf16():
    rng = np.random.default_rng(random.randrange(1 << 30))
    splits = (separable(rng, 32), separable(rng, 16), separable(rng, 16))
    torch.manual_seed(1)
    a = LanguageModel(debug_config(vocab_size=259)).eval()
    torch.manual_seed(2)
    b = LanguageModel(debug_config(vocab_size=259)).eval().bfloat16()
    before = {k: v.clone() for k, v in b.state_dict().items()}
    kw = dict(epochs=1, lr=3e-3, rows=8, batch_tokens=4096, max_tokens=0, seed=0)
    scratch = [fine_tune(m, splits, [1], 2, FineTuneConfig(**kw, from_scratch=True), 258) for m in (a, b)]
    tuned = [fine_tune(m, splits, [1], 2, FineTuneConfig(**kw, from_scratch=False), 258) for m in (a, b)]
    assert scratch[0].train_loss_by_epoch == scratch[1].train_loss_by_epoch  # the checkpoint plays no part
    assert tuned[0].train_loss_by_epoch != tuned[1].train_loss_by_epoch  # ... it does when fine-tuning it
    assert b.embedding.weight.dtype == torch.bfloat16
    for k, v in b.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_texts_are_cut_to_max_tokens_and_counted():
    rng = np.random.default_rng(random.randrange(1 << 30))
    splits = (separable(rng, 24), separable(rng, 8), separable(rng, 8))
    longer = sum(len(s) > 6 for seqs, _ in splits for s in seqs)
    torch.manual_seed(0)
    model = LanguageModel(debug_config(vocab_size=259)).eval()
    cfg = FineTuneConfig(
        epochs=1, lr=3e-3, rows=8, batch_tokens=4096, max_tokens=6, seed=0, from_scratch=False
    )
    ft = fine_tune(model, splits, [1], 2, cfg, pad_id=258)
    assert ft.truncated == longer > 0
    assert ft.tokens == sum(min(len(s), 6) for s in splits[0][0])
