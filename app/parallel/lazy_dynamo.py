"""TorchDynamo imported when something compiles, not when an optimizer is built.

torch.optim imports `torch._dynamo` the first time an optimizer adds a param group or steps: `add_param_group`,
`zero_grad`, `state_dict` and `load_state_dict` are wrapped by `torch._disable_dynamo`, which asks
`torch._dynamo.disable` for a not-compiled version of the method, and every `step` calls
`torch._dynamo.graph_break()` before and after the update. Outside `torch.compile` both do nothing: the method
runs as it is, and there is no graph to break. The import is what costs: sympy, FX's symbolic shapes and
Dynamo's bytecode tracer, 2.7 s of a core on a 2-core EPYC, about a third of a CPU training rank's start-up
(docs/development.md, Tests). A run of ours compiles nothing (the GPU core is Triton's, not torch.compile's).

`defer_dynamo_import()` puts a stand-in at `torch._dynamo` until something asks it for anything else:
- `disable(fn)` returns a function that runs `fn` while the stand-in is in place, and Dynamo's disabled `fn`
  once the real module is imported; `graph_break()` returns while the stand-in is in place. A reference to
  the stand-in kept past that point answers as the real module does.
- Any other attribute (torch.compile's entry points, `config`, a submodule's `__path__`) imports the real
  module, which replaces the stand-in in `sys.modules` and on `torch`, and is read from it. Dunder probes
  (`__file__`, `__wrapped__`: inspect, pickle) do not.
- A submodule imported first (`import torch._dynamo.config`) is loaded once: Python reads the parent's
  `__path__` (which imports the real package, and with it that submodule) after checking `sys.modules` for
  the submodule, so a finder at the front of `sys.meta_path` hands back the module the package just loaded.

Uses how torch.optim reaches `torch._dynamo` (torch internals): a torch release that asks the module for
anything else imports the real one, and costs the time and nothing else; tests/test_parallel_lazy_dynamo.py
fails then, saying the saving is gone.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.util
import sys
import threading
import types

NAME = "torch._dynamo"
_LOCK = threading.RLock()
_PASSED_THROUGH = ("__path__", "__all__")  # dunders that mean "the package itself": the real one


class _StandIn(types.ModuleType):
    """`torch._dynamo` until something needs more of it than torch.optim's two calls."""

    def disable(self, fn=None, recursive=True, **kwargs):
        """Outside a compile, a function with Dynamo disabled is the function: until the real module is
        imported. Then the real `disable`, once, for every later call."""
        if sys.modules.get(NAME) is not self:
            return real_dynamo().disable(fn, recursive, **kwargs)
        if fn is None:
            return lambda f: self.disable(f, recursive, **kwargs)
        disabled = None

        @functools.wraps(fn)
        def until_dynamo(*args, **kw):
            nonlocal disabled
            if disabled is None:
                if deferred():
                    return fn(*args, **kw)
                disabled = real_dynamo().disable(fn, recursive, **kwargs)
            return disabled(*args, **kw)

        return until_dynamo

    def graph_break(self, *args, **kwargs) -> None:
        """Outside a compile there is no graph to break."""
        if sys.modules.get(NAME) is not self:
            real_dynamo().graph_break(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__") and name not in _PASSED_THROUGH:
            raise AttributeError(name)
        return getattr(real_dynamo(), name)


class _AlreadyLoaded(importlib.abc.Loader):
    """Hands the import system a module that is in `sys.modules` already, as it was."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec):
        return self.module

    def exec_module(self, module) -> None:
        # the import system set ours on it; a module that takes no new attributes (Dynamo's config) kept its own
        with contextlib.suppress(AttributeError):
            module.__spec__ = self.spec


class _SubmoduleFinder(importlib.abc.MetaPathFinder):
    """A `torch._dynamo.X` that the real package loaded while Python was reading the stand-in's `__path__`."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(NAME + ".") or fullname not in sys.modules:
            return None
        return importlib.util.spec_from_loader(fullname, _AlreadyLoaded(sys.modules[fullname]))


def real_dynamo() -> types.ModuleType:
    """The real `torch._dynamo`, imported now if the stand-in is in its place."""
    with _LOCK:
        restore()
        return importlib.import_module(NAME)


def deferred() -> bool:
    """Whether `torch._dynamo` is the stand-in (nothing has needed the real one yet)."""
    return isinstance(sys.modules.get(NAME), _StandIn)


def defer_dynamo_import() -> bool:
    """Put the stand-in at `torch._dynamo` unless the real one is imported already. -> whether it is there."""
    import torch  # noqa: F401 - the parent package first (importing torch may import Dynamo itself)

    with _LOCK:
        if NAME in sys.modules:
            return deferred()
        # found, not run: find_spec on the stand-in then answers as on the real one
        spec = importlib.util.find_spec(NAME)
        if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _SubmoduleFinder())
        stand_in = _StandIn(NAME, "a stand-in until TorchDynamo is needed (app.parallel.lazy_dynamo)")
        stand_in.__spec__ = spec
        sys.modules[NAME] = stand_in
        return True


def restore() -> None:
    """Take the stand-in away (the real module is imported when next asked for): for `real_dynamo`, and for a
    process that runs other code after its training (the test suite's workers)."""
    with _LOCK:
        module = sys.modules.get(NAME)
        if isinstance(module, _StandIn):
            del sys.modules[NAME]
            torch = sys.modules["torch"]
            if torch.__dict__.get("_dynamo") is module:
                del torch.__dict__["_dynamo"]
