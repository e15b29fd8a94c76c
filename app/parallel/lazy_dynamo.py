"""TorchDynamo imported when something compiles, not when an optimizer is built.

torch.optim imports `torch._dynamo` the first time an optimizer adds a param group or steps: `add_param_group`,
`zero_grad`, `state_dict` and `load_state_dict` are wrapped by `torch._disable_dynamo`, which asks
`torch._dynamo.disable` for a not-compiled version of the method, and every `step` calls
`torch._dynamo.graph_break()` before and after the update. Outside `torch.compile` both do nothing: the method
runs as it is, and there is no graph to break. The import is what costs: sympy, FX's symbolic shapes and
Dynamo's bytecode tracer, 2.7 s of a core on a 2-core EPYC, as much as torch and DeepSpeed's own imports
together and about half of a CPU rank's start-up (docs/development.md, Tests). A run of ours compiles nothing
(the GPU core is Triton's, not torch.compile's).

`defer_dynamo_import()` puts a stand-in at `torch._dynamo` until something asks it for anything else:
- `disable(fn)` returns `fn` and `graph_break()` returns, as the real ones do outside a compile;
- any other attribute (torch.compile's entry points, a submodule's import, `config`) imports the real module,
  which replaces the stand-in in `sys.modules` and on `torch`, and is read from it.
A method torch.optim had already wrapped through the stand-in stays as it is: it runs as written even inside a
later compile, where Dynamo would otherwise have skipped it (a graph break instead of a skipped frame).

Uses torch internals (how `torch.optim` reaches `torch._dynamo`): torch's upper bound in pyproject.toml; a torch
that asks the module for something else imports the real one, costing the time and nothing else.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

NAME = "torch._dynamo"


class _StandIn(types.ModuleType):
    """`torch._dynamo` until something needs more of it than torch.optim's two calls."""

    def disable(self, fn=None, recursive=True, **_kwargs):  # the real one's signature
        """Outside a compile, a function with Dynamo disabled is the function."""
        return fn if fn is not None else (lambda f: f)

    def graph_break(self, *_args, **_kwargs) -> None:
        """Outside a compile there is no graph to break."""

    def __getattr__(self, name: str):
        return getattr(real_dynamo(), name)


def real_dynamo() -> types.ModuleType:
    """The real `torch._dynamo`, imported now if the stand-in is in its place."""
    module = sys.modules.get(NAME)
    if isinstance(module, _StandIn):
        del sys.modules[NAME]
        torch = sys.modules["torch"]
        if torch.__dict__.get("_dynamo") is module:
            del torch.__dict__["_dynamo"]
    return importlib.import_module(NAME)


def deferred() -> bool:
    """Whether `torch._dynamo` is the stand-in (nothing has needed the real one yet)."""
    return isinstance(sys.modules.get(NAME), _StandIn)


def defer_dynamo_import() -> bool:
    """Put the stand-in at `torch._dynamo` unless the real one is imported already. -> whether it is there."""
    if NAME in sys.modules:
        return deferred()
    import torch  # noqa: F401 - the parent package first (importing torch may import Dynamo itself)

    if NAME in sys.modules:
        return deferred()
    spec = importlib.util.find_spec(NAME)  # found, not run: find_spec on the stand-in answers as the real one
    stand_in = _StandIn(NAME, "a stand-in until TorchDynamo is needed (app.parallel.lazy_dynamo)")
    stand_in.__spec__ = spec
    sys.modules[NAME] = stand_in
    return True
