"""app/training/samples.py and the trainer's samples: drawn from the whole model in every layout, without
touching training's RNG, kernel table or environment."""

from __future__ import annotations

import os

import pytest
import torch
from run_files import check_samples
from test_checkpoints_consolidate import tiny

from app.common.errors import UserError
from app.model import matmul
from app.training.samples import read_prompts, sample_texts
from data_prep.tokenizer import ByteTokenizer


def test_sampling_leaves_rng_kernel_table_and_environment_alone():
    model, tok = tiny(), ByteTokenizer()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))  # a fresh stream each run of the test
    rng, table, env = torch.get_rng_state(), matmul.export_choices(), os.environ.get("MLSTM_MATMUL")
    kw = dict(num_samples=3, max_new_tokens=12, seed=7)
    first = sample_texts(state, model.cfg, tok, ["ab", ""], **kw)
    assert torch.equal(torch.get_rng_state(), rng), "sampling moved the global RNG"
    assert matmul.export_choices() == table and os.environ.get("MLSTM_MATMUL") == env
    assert [r["prompt"] for r in first] == ["ab"] * 3 + [""] * 3
    again = sample_texts(state, model.cfg, tok, ["ab", ""], **kw)
    assert [r["tokens"] for r in again] == [r["tokens"] for r in first]  # the seed alone decides
    other = sample_texts(state, model.cfg, tok, ["ab", ""], **{**kw, "seed": 8})
    assert [r["tokens"] for r in other] != [r["tokens"] for r in first]


def test_sample_prompts_file(tmp_path):
    assert read_prompts(None) == [""]
    f = tmp_path / "p.txt"
    f.write_text("def \n\n  \nThe cat\n")
    assert read_prompts(str(f)) == ["def ", "The cat"]
    f.write_text("\n \n")
    with pytest.raises(UserError, match=r"--sample-prompts .*no prompts"):
        read_prompts(str(f))
    with pytest.raises(UserError, match=r"--sample-prompts .*cannot read"):
        read_prompts(str(tmp_path / "missing.txt"))


@pytest.mark.slow
def test_samples_are_the_whole_models_in_pipeline_layouts(reference_run, pp2_dp2_run):
    """P = 2 x DP = 1 and P = 2 x DP = 2: samples at each validation; the last ones equal those sampled
    in this process from the consolidated final checkpoint, so every stage's weights were gathered."""
    ref = check_samples(reference_run[0], [4, 8])
    dp2 = check_samples(pp2_dp2_run, [4, 8])
    assert all(r["prompt"] == "" and r["stop"] in ("length", "eos") for r in ref[8] + dp2[8])


def test_samples_at_every_validation_on_cpu_and_at_the_end_on_cuda():
    from app.training.samples import samples_at_end

    assert samples_at_end(None) is torch.cuda.is_available()
    assert (samples_at_end("end"), samples_at_end("validation")) == (True, False)
