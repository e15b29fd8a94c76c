"""The test harness's start-up saving: launched test processes skip two imports a CPU test run never uses.

tests/launcher.py puts this folder first on PYTHONPATH of every process it starts (its `env()`), so Python's
`site` module imports this file when each of them starts. Nothing in app/ or data_prep/ knows of it: users'
processes import what torch and DeepSpeed import. What it skips (bench/startup.py measures both):

- TorchDynamo. torch.optim imports `torch._dynamo` the first time an optimizer adds a param group or steps:
  `add_param_group`, `zero_grad`, `state_dict` and `load_state_dict` are wrapped by `torch._disable_dynamo`,
  which asks `torch._dynamo.disable` for a not-compiled version of the method, and every `step` calls
  `torch._dynamo.graph_break()` before and after the update. Outside `torch.compile` both do nothing. The
  first import of `torch._dynamo` gets a stand-in that answers those two calls; anything else asked of it
  (torch.compile's entry points, `config`, a submodule's `__path__`) imports the real module, which replaces
  the stand-in in `sys.modules` and on `torch`. A submodule imported first (`import torch._dynamo.config`)
  is loaded once: Python reads the parent's `__path__` (which imports the real package, and with it that
  submodule), then asks the finders for the submodule, and this finder hands back the module already loaded.
- DeepSpeed's Muon modules. With ZeRO, DeepSpeed imports `deepspeed.runtime.zero.muon.*` to ask whether the
  optimizer is its MuonWithAuxAdam; their `torch.compile` decorators import TorchInductor's compiler. Here
  both are stand-ins: a class that no optimizer is an instance of, and an update that raises if called (no
  test trains with Muon).

Neither torch nor DeepSpeed offers a switch for either import (TORCH_COMPILE_DISABLE=1 still imports both),
hence stand-ins, which the house keeps out of product code (STYLE.md, item 13). A torch or DeepSpeed release
that reaches these modules another way costs the time and nothing else; tests/test_fast_start.py then fails,
saying the saving is gone.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types

DYNAMO = "torch._dynamo"
MUON = ("deepspeed.runtime.zero.muon.muon_optimizer", "deepspeed.runtime.zero.muon.original_muon")
_LOCK = threading.RLock()
_PASSED_THROUGH = ("__path__", "__all__")  # dunders that mean "the package itself": the real one


class _Dynamo(types.ModuleType):
    """`torch._dynamo` until something needs more of it than torch.optim's two calls."""

    def disable(self, fn=None, recursive=True, **kwargs):
        """Outside a compile, a function with Dynamo disabled is the function: until the real module is
        imported. Then the real `disable`, once, for every later call."""
        if sys.modules.get(DYNAMO) is not self:
            return real_dynamo().disable(fn, recursive, **kwargs)
        if fn is None:
            return lambda f: self.disable(f, recursive, **kwargs)
        disabled = None

        @functools.wraps(fn)
        def until_dynamo(*args, **kw):
            nonlocal disabled
            if disabled is None:
                if isinstance(sys.modules.get(DYNAMO), _Dynamo):
                    return fn(*args, **kw)
                disabled = real_dynamo().disable(fn, recursive, **kwargs)
            return disabled(*args, **kw)

        return until_dynamo

    def graph_break(self, *args, **kwargs) -> None:
        """Outside a compile there is no graph to break."""
        if sys.modules.get(DYNAMO) is not self:
            real_dynamo().graph_break(*args, **kwargs)

    _placed = False  # set once the import system has put it in sys.modules (it probes dunders before)

    def __getattr__(self, name: str):
        if name.startswith("__") and (name not in _PASSED_THROUGH or not self._placed):
            raise AttributeError(name)
        return getattr(real_dynamo(), name)


class _NoMuon:
    """Stands for DeepSpeed's MuonWithAuxAdam: never instantiated, so `isinstance(optimizer, ...)` is False."""


def _no_muon_update(*_args, **_kwargs):
    raise RuntimeError("DeepSpeed's Muon update was called under tests/fast_start (a run without Muon)")


def _muon(name: str) -> types.ModuleType:
    module = types.ModuleType(name, "a stand-in (tests/fast_start/sitecustomize.py)")
    module.MuonWithAuxAdam = _NoMuon
    module.muon_update = _no_muon_update
    return module


class _Made(importlib.abc.Loader):
    """Hands the import system a module made here."""

    def __init__(self, make) -> None:
        self.make = make

    def create_module(self, spec):
        return self.make(spec.name)

    def exec_module(self, module) -> None:
        module._placed = True


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


class _Finder(importlib.abc.MetaPathFinder):
    """Answers for `torch._dynamo` (until the real one is wanted), its submodules that the real package loaded
    while Python read the stand-in's `__path__`, and DeepSpeed's two Muon modules."""

    real_dynamo = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname == DYNAMO and not self.real_dynamo:
            return importlib.machinery.ModuleSpec(fullname, _Made(_Dynamo))
        if fullname.startswith(DYNAMO + ".") and fullname in sys.modules:
            return importlib.machinery.ModuleSpec(fullname, _AlreadyLoaded(sys.modules[fullname]))
        if fullname in MUON:
            return importlib.machinery.ModuleSpec(fullname, _Made(_muon))
        return None


_FINDER = _Finder()


def real_dynamo() -> types.ModuleType:
    """The real `torch._dynamo`, imported now if the stand-in is in its place."""
    with _LOCK:
        _FINDER.real_dynamo = True
        module = sys.modules.get(DYNAMO)
        if isinstance(module, _Dynamo):
            del sys.modules[DYNAMO]
            torch = sys.modules["torch"]
            if torch.__dict__.get("_dynamo") is module:
                del torch.__dict__["_dynamo"]
        return importlib.import_module(DYNAMO)


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _FINDER)
