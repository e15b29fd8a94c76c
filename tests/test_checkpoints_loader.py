"""`--checkpoint`: what a checkpoint's or an export's JSON states is checked before anything is built."""

from __future__ import annotations

import json

import pytest
from test_checkpoints_consolidate import fake_checkpoint, rewrite_manifest, tiny

from app.checkpoints.loader import open_source
from app.common.errors import UserError
from app.export import export


@pytest.mark.parametrize("kind", ["checkpoint", "export"])
@pytest.mark.parametrize(
    "change, needle",
    [
        ({"vocab_size": 10**12}, "model_config.vocab_size is 1,000,000,000,000, the tokenizer's 259"),
        ({"hidden_dim": 10**6}, "hidden 1,000,000"),
        ({"num_layers": 10**12}, "model_config.num_layers must be an integer in [1, 4,096]"),
    ],
)
def test_sizes_a_folder_states_are_checked_before_use(tmp_path, kind, change, needle):
    """A model config the weights cannot hold (a vocabulary of 10^12, a million units, 10^12 layers whose
    expected shapes were built in a loop) is one line naming the file and the field, at open."""
    d = fake_checkpoint(tmp_path / "run", tiny(), "module")
    if kind == "export":
        d = export(d, tmp_path / "export")
    assert open_source(d).model_cfg.hidden_dim == 64  # the folder as written opens
    file = d / ("config.json" if kind == "export" else "app_state.json")
    obj = json.loads(file.read_text())
    obj["model_config"].update(change)
    file.write_text(json.dumps(obj))
    if kind == "checkpoint":
        rewrite_manifest(d)
    with pytest.raises(UserError) as e:
        open_source(d)
    line = str(e.value)
    if "hidden_dim" in change:  # against the weights: the bytes a checkpoint holds, an export's shapes
        assert (
            line.startswith(
                f"{file}: model_config (vocab 259, embed 32, hidden 1,000,000, 2 layers) needs at least"
            )
            if kind == "checkpoint"
            else line.startswith(f"{d / 'model.safetensors'} (against {file}): weight shapes do not match")
        ), line
    else:
        assert line.startswith(f"{file}: ") and needle in line, line
