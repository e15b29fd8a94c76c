"""app.parallel.lazy_dynamo: torch.optim builds, steps, saves and loads without importing TorchDynamo, to the
same bits; anything else that asks for TorchDynamo (torch.compile, a submodule) gets the real one. Each case
runs in a fresh interpreter: whether a module is imported is a property of the process."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_ADAMW = """
import json, sys
import torch
from app.parallel import lazy_dynamo
put = sys.argv[1] == "defer" and lazy_dynamo.defer_dynamo_import()
g = torch.Generator().manual_seed(int(sys.argv[2]))
ps = [torch.nn.Parameter(torch.randn(7, 5, generator=g, dtype=torch.float64)) for _ in range(2)]
opt = torch.optim.AdamW([{"params": ps[:1]}, {"params": ps[1:], "lr": 3e-3}], lr=1e-2, weight_decay=0.1)
for _ in range(3):
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64)
    opt.step()
    opt.zero_grad()
opt.load_state_dict(opt.state_dict())
opt.step()  # with no gradients: a no-op that still passes the step's graph breaks
report = {"put": put, "stand_in": lazy_dynamo.deferred(), "real": "torch._dynamo.eval_frame" in sys.modules,
          "params": [p.detach().flatten().tolist() for p in ps]}
"""


def _run(code: str, *args: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_adamw_steps_to_the_same_bits_without_importing_dynamo_and_compile_gets_the_real_one():
    """The installed torch's AdamW reaches TorchDynamo only through the two calls the stand-in answers (if a
    torch release asks for more, the real module is imported and this fails: the start-up saving is gone).
    Then a submodule imported first (as FX's symbolic shapes and DeepSpeed's compiler do) is the one Dynamo's
    own modules hold, loaded once; torch.compile runs; the stand-in's methods, held from before, answer as the
    real module's. Where AdamW has imported the real module (no stand-in), it is left in place."""
    seed = str(random.randrange(1 << 30))
    plain = _run(_ADAMW + _PLAIN, "plain", seed)
    deferred = _run(_ADAMW + _AFTER, "defer", seed)
    assert plain["real"] and not plain["stand_in"] and plain["again"] == [False, False], (seed, plain)
    assert deferred["put"] and deferred["stand_in"] and not deferred["real"], (seed, deferred)
    assert deferred["params"] == plain["params"], seed  # the same update, bit for bit
    assert deferred["after"] == {
        "config_once": True, "y": [3.0, 3.0, 3.0], "stand_in": False, "same": True, "held_disable": True,
        "dunder": [False, True],
    }, deferred["after"]  # fmt: skip


_PLAIN = """
report["again"] = [lazy_dynamo.defer_dynamo_import(), lazy_dynamo.deferred()]
print(json.dumps(report))
"""
_AFTER = """
stand_in = sys.modules["torch._dynamo"]
dunder = [hasattr(stand_in, "__file__"), lazy_dynamo.deferred()]  # inspect's probe: no import
import torch._dynamo.config as c
once = c is sys.modules["torch._dynamo.eval_frame"].config is sys.modules["torch._dynamo.convert_frame"].config
f = torch.compile(lambda x: x * 2 + 1, backend="eager")
y = f(torch.ones(3)).tolist()
real = sys.modules["torch._dynamo"]
held = stand_in.disable(len)
report["after"] = {"config_once": once and c is real.config, "y": y, "stand_in": lazy_dynamo.deferred(),
                   "same": real is torch._dynamo is lazy_dynamo.real_dynamo(), "dunder": dunder,
                   "held_disable": held is not len and held([1, 2]) == 2}
print(json.dumps(report))
"""
