"""`export.py --check-hf`: load a just-written export with transformers and compare it with our own model.

The remote code it runs is the code the export itself just wrote (app/checkpoints/hf_remote), from
the local folder only (local_files_only: no hub access).
"""

from __future__ import annotations

from pathlib import Path

import torch

from app.checkpoints.hf_format import import_transformers
from app.checkpoints.loader import open_source
from app.common.errors import UserError

PROBE = "The  quick\tbrown\r\n  fox: caf\u00e9 \u4e2d\u6587 <s> </s>\n"


def check_hf_export(out: Path, flag: str) -> float:
    """Max |logit difference| on random ids (float32); refuses (one line) a mismatch of logits or token ids."""
    transformers = import_transformers(flag)
    transformers.utils.logging.disable_progress_bar()  # one result line, not a loading bar
    src = open_source(out)
    ours, tok = src.load_model(), src.tokenizer()
    kw = dict(trust_remote_code=True, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, **kw).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out), **kw)
    ids = torch.randint(0, src.model_cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = ours(ids), model(ids).logits  # (B, T, V) each
    diff = float((want - got).abs().max())
    if not diff <= 1e-4 * max(1.0, float(want.abs().max())):
        raise UserError(f"{flag}: {out}: transformers' logits differ from ours by up to {diff:.2e}")
    if hf_tok(PROBE, add_special_tokens=False)["input_ids"] != tok.encode(PROBE):
        raise UserError(f"{flag}: {out}: transformers' tokenizer encodes a probe text to other ids than ours")
    if hf_tok.decode(hf_tok(PROBE)["input_ids"], skip_special_tokens=True) != PROBE:
        raise UserError(f"{flag}: {out}: transformers' tokenizer does not decode a probe text back to itself")
    return diff
