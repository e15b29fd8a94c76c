"""tests/fast_start/sitecustomize.py, the harness's start-up saving for the processes tests/launcher.py starts:
torch.optim builds, steps, saves and loads without importing TorchDynamo, to the same bits; anything else that
asks for TorchDynamo (torch.compile, a submodule) gets the real one; a ZeRO engine trains without importing
TorchInductor for DeepSpeed's Muon kernels. Each case runs in a fresh interpreter: whether a module is
imported is a property of the process."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

from launcher import FAST_START, ROOT, env

_ADAMW = """
import json, sys
import torch
harness = getattr(sys.modules.get("sitecustomize"), "__file__", "")
g = torch.Generator().manual_seed(int(sys.argv[1]))
ps = [torch.nn.Parameter(torch.randn(7, 5, generator=g, dtype=torch.float64)) for _ in range(2)]
opt = torch.optim.AdamW([{"params": ps[:1]}, {"params": ps[1:], "lr": 3e-3}], lr=1e-2, weight_decay=0.1)
for _ in range(3):
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64)
    opt.step()
    opt.zero_grad()
opt.load_state_dict(opt.state_dict())
opt.step()  # with no gradients: a no-op that still passes the step's graph breaks
report = {"harness": harness, "stand_in": type(sys.modules["torch._dynamo"]).__name__,
          "real": "torch._dynamo.eval_frame" in sys.modules, "params": [p.detach().flatten().tolist() for p in ps]}
"""
_AFTER = """
stand_in = sys.modules["torch._dynamo"]
dunder = hasattr(stand_in, "__file__")  # inspect's probe: no import
import torch._dynamo.config as c
once = c is sys.modules["torch._dynamo.eval_frame"].config is sys.modules["torch._dynamo.convert_frame"].config
f = torch.compile(lambda x: x * 2 + 1, backend="eager")
y = f(torch.ones(3)).tolist()
real = sys.modules["torch._dynamo"]
held = stand_in.disable(len)
report["after"] = {"config_once": once and c is real.config, "y": y, "stand_in": type(real).__name__,
                   "same": real is torch._dynamo, "dunder": dunder, "held_disable": held is not len and held([1, 2]) == 2}
print(json.dumps(report))
"""


def _run(code: str, *args: str, harness: bool) -> dict:
    e = env() if harness else {k: v for k, v in env().items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=e)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_launched_processes_start_with_the_harness():
    e = env()
    assert e["PYTHONPATH"].split(os.pathsep)[0] == str(FAST_START)
    code = "import sys; print(sys.modules['sitecustomize'].__file__)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=60)
    assert p.stdout.strip() == str(FAST_START / "sitecustomize.py"), p.stderr


def test_adamw_steps_to_the_same_bits_without_importing_dynamo_and_compile_gets_the_real_one():
    """The installed torch's AdamW reaches TorchDynamo only through the two calls the stand-in answers (if a
    torch release asks for more, the real module is imported and this fails: the start-up saving is gone).
    Then a submodule imported first (as FX's symbolic shapes and DeepSpeed's compiler do) is the one Dynamo's
    own modules hold, loaded once; torch.compile runs; the stand-in's methods, held from before, answer as the
    real module's."""
    seed = str(random.randrange(1 << 30))
    plain = _run(_ADAMW + "print(json.dumps(report))", seed, harness=False)
    fast = _run(_ADAMW + _AFTER, seed, harness=True)
    assert plain["real"] and plain["stand_in"] == "module" and not plain["harness"], (seed, plain)
    assert fast["stand_in"] == "_Dynamo" and not fast["real"] and fast["harness"], (seed, fast)
    assert fast["params"] == plain["params"], seed  # the same update, bit for bit
    assert fast["after"] == {
        "config_once": True, "y": [3.0, 3.0, 3.0], "stand_in": "module", "same": True, "held_disable": True,
        "dunder": False,
    }, fast["after"]  # fmt: skip


_ZERO = """
import json, os, sys
import deepspeed, torch
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2},
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
engine, opt, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
loss = engine(torch.randn(2, 8)).square().mean()
engine.backward(loss)
engine.step()
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
print(json.dumps({"inductor": "torch._inductor.compile_fx" in sys.modules, "dynamo": "torch._dynamo.eval_frame" in
                  sys.modules, "muon": isinstance(opt, MuonWithAuxAdam) or isinstance(opt.optimizer, MuonWithAuxAdam),
                  "loss": loss.item()}))
"""


def test_a_zero_engine_trains_without_importing_dynamo_or_inductor():
    """DeepSpeed's ZeRO imports its Muon modules to ask whether the optimizer is Muon: under the harness the
    answer is no, as it is, and TorchInductor (which those modules' `torch.compile` decorators import) and
    TorchDynamo are never imported; without it, both are."""
    port = str(29400 + os.getpid() % 500)
    fast = _run(_ZERO, port, harness=True)
    plain = _run(_ZERO, port, harness=False)
    assert fast["muon"] is plain["muon"] is False
    assert not fast["inductor"] and not fast["dynamo"], fast
    assert plain["inductor"] and plain["dynamo"], plain  # what the harness saves: still there to save
    assert fast["loss"] == plain["loss"]
