"""The suite's named launched runs: each built once, read by many tests (tests/conftest.py's `runs` fixture).

A run is a row of RUNS: the corpus it trains on (a row of CORPORA, prepared once), its layout (ranks under
DeepSpeed's launcher, pipeline stages, the DeepSpeed JSON) and its flags. A parity test compares two runs
of the table; a test that changes a run works on a copy (`start_from` makes such a copy a run of its own:
a resume in another layout, say).

Where they are kept (docs/development.md, Tests): `MLSTM_TEST_RUN_CACHE` (default `.test-runs/` in the
checkout; `0` keeps them in the session's temp folder only). Under it, one folder per key: a hash of
everything a run's bytes can depend on (the code and configs it runs, the corpora's texts, this file and
tests/launcher.py, the installed distributions, the Python, the CPU and the compiler, the environment a
launch inherits). A later session with the same key reuses the runs, after checking every file of each
against the list of sizes and SHA-256 digests taken when it was built (one changed file, and the run is
built again, with a warning).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from launcher import ROOT, env, train, train_one_process

TINY_PREP_ARGS = ["--default-max-mb", "0.3", "--max-seq-len", "64", "--num-proc", "2", "--quiet"]
REF_STEPS = "8"
FAKE_WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"

# prepared corpora: data_prep's flags besides --out and TINY_PREP_ARGS
CORPORA = {
    "spm": ["--vocab-size", "384"],  # SentencePiece on 0.3 MB of the embedded default corpus, max_seq_len 64
    "byte": ["--tokenizer", "byte"],  # the byte tokenizer on the same text
}


@dataclass(frozen=True)
class Spec:
    """One named run of app/train.py. In `flags` and `files`, {DIR} is the run's own folder (its --out is
    DIR/<name>) and {ROOT} the checkout."""

    corpus: str
    """a name in CORPORA: --data"""
    procs: int
    """ranks under DeepSpeed's per-node launcher; 0: one plain process (`python app/train.py`)"""
    stages: int = 2
    flags: tuple[str, ...] = ()
    config: str | None = "cpu_pp2_zero1.json"
    """the DeepSpeed JSON in ds_configs/ (--deepspeed_config); None: the flags name one"""
    env: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    """name -> text, written in the run's folder before it starts (a --config file, a DeepSpeed JSON)"""
    start_from: str | None = None
    """a run of the table whose folder is copied to --out first: this run resumes it"""
    script: str = "app/train.py"
    runner: bool = False
    """the `deepspeed` command itself rather than its per-node launcher (tests/launcher.py)"""
    progress: bool = False
    """the progress bar left at its default"""


_REF = ("--max-steps", REF_STEPS, "--save-every", "3", "--keep-last", "2", "--eval-every", "4")
_ZERO2_ACCUM2 = "deepspeed: {ROOT}/ds_configs/cpu_zero2.json\ngrad_accum: 2\n"  # 2 x DP 2 = the ref's 4
_TIED = ("--max-steps", "3", "--eval-every", "0", "--wandb-mode", "disabled", "--test-eval", "false",
         "model.tie_embeddings=true", "model.embed_dim=64")  # fmt: skip
_CARRY = ("--carry-state", "true", "--max-steps", "6", "--save-every", "3", "--keep-last", "2",
          "--eval-every", "0", "--test-eval", "false", "--wandb-mode", "disabled", "--deterministic", "true",
          "--partition-method", "cost", "--sanity-eval-batches", "0", "--samples", "0")  # fmt: skip
_RESUME_6 = ("--max-steps", "8", "--resume", "step_00000006", "--eval-every", "4", "--save-every", "3",
             "--keep-last", "2", "--wandb-mode", "disabled")  # fmt: skip
# cpu_pp2_zero1.json written as HF users hand it over: "auto" wherever HF's integration fills a value.
# HF_FLAGS give the same micro-batch 8, accumulation 4, lr 0.003 and fp32; the "auto" optimizer
# and clipping values get HF's defaults, which are the stock file's (eps 1e-8, weight_decay 0, clip 1.0).
HF_CONFIG = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "optimizer": {
        "type": "AdamW",
        "params": {
            "lr": "auto",
            "betas": [0.9, 0.99],
            "eps": "auto",
            "weight_decay": "auto",
            "torch_adam": True,
        },
    },
    "scheduler": {
        "type": "WarmupCosineLR",
        "params": {"warmup_num_steps": "auto", "total_num_steps": "auto", "cos_min_ratio": 0.1},
    },
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 1, "reduce_bucket_size": "auto"},
}
HF_FLAGS = ("--micro-batch", "8", "--grad-accum", "4", "--lr", "0.003")

RUNS: dict[str, Spec] = {
    # the reference: P = 2 x DP = 1, grad_accum 4, 8 steps, W&B offline with a (fake) API key in the
    # environment; plots, samples (4 per validation) and the final model artifact, as a user gets them.
    # Launched as an installed user would, `deepspeed --module app.train`, the progress bar left at its
    # default (stderr is a pipe here: tests/test_train.py checks the log holds no bar). Checkpoints kept:
    # step 6 and step 8 (latest).
    "ref": Spec("spm", 2, flags=(*_REF, "--wandb-mode", "offline", "--plots", "true"),
                env={"WANDB_API_KEY": FAKE_WANDB_KEY}, script="app.train", progress=True, runner=True),
    # 4 processes: P = 2 stages x DP = 2 ZeRO-1 replicas, grad_accum 2 (the same global batches as ref);
    # the accumulation from `--grad-accum 2` over the stock JSON (accum 4), named HF-style by `--deepspeed`
    "dp2": Spec("spm", 4, flags=("--deepspeed", "{ROOT}/ds_configs/cpu_pp2_zero1.json", "--grad-accum", "2",
                                 "--max-steps", REF_STEPS, "--eval-every", "4", "--wandb-mode", "disabled"),
                config=None),
    # P = 1 under the plain engine, ZeRO-2, DP = 2, grad_accum 2, the JSON and accumulation from a YAML
    # --config (the stock cpu_zero2.json has another accumulation); W&B offline, an artifact per save
    "p1_zero2_dp2": Spec("spm", 2, stages=1, config=None,
                         files={"zero2.yaml": _ZERO2_ACCUM2 + "wandb_mode: offline\n"},
                         flags=("--config", "{DIR}/zero2.yaml", "--max-steps", REF_STEPS, "--eval-every", "4",
                                "--wandb-artifacts", "saves", "--save-every", "4")),
    # the tied embedding at P = 1 (one plain process) and at P = 2 (on both stages there). tied_p2's ranks
    # time their matmul peak 10^5 times too low (MLSTM_DS_FAULTS, as under a busy core): its MFU is raised to
    # the fastest step's (tests/test_training_peak_flops.py); no loss or norm depends on the peak
    "tied_p1": Spec("spm", 0, stages=1, flags=_TIED),
    "tied_p2": Spec("spm", 2, flags=_TIED, env={"MLSTM_DS_FAULTS": "peak_divide=100000"}),
    # the "auto" DeepSpeed JSON and flags equal to the stock file: ref's losses
    "hf_auto": Spec("spm", 2, config=None, files={"hf.json": json.dumps(HF_CONFIG)},
                    flags=("--deepspeed_config", "{DIR}/hf.json", *HF_FLAGS, "--max-steps", REF_STEPS,
                           "--eval-every", "100", "--samples", "0", "--test-eval", "false",
                           "--wandb-mode", "disabled", "--plots", "false")),
    # ref resumed from its step 6 in other layouts: one plain process (P = 1), and P = 1 x DP = 2 with
    # half the accumulation (ZeRO-2)
    "ref_as_p1": Spec("spm", 0, stages=1, start_from="ref", flags=_RESUME_6),
    "ref_as_dp2": Spec("spm", 2, stages=1, start_from="ref", config=None, files={"zero2.yaml": _ZERO2_ACCUM2},
                       flags=("--config", "{DIR}/zero2.yaml", *_RESUME_6)),
    # --carry-state, 6 steps saved at 3; then resumed from 3 in a copy
    "carry": Spec("spm", 2, flags=_CARRY),
    "carry_resumed": Spec("spm", 2, start_from="carry", flags=(*_CARRY, "--resume", "step_00000003")),
}  # fmt: skip


@dataclass
class Run:
    """A built run: its --out folder, the launch's CompletedProcess, and the checkout's commit when it was
    launched (a run kept from an earlier session of the same tree records that one)."""

    dir: Path
    proc: subprocess.CompletedProcess
    commit: str | None


class Runs:
    """The table's runs and corpora, built on first use, under a lock per entry: pytest-xdist's workers
    (and sessions one after the other) share them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.session = os.environ.get("MLSTM_SUITE_SESSION", str(os.getpid()))

    @classmethod
    def for_session(cls, session_dir: Path) -> Runs:
        """At MLSTM_TEST_RUN_CACHE (default .test-runs/ in the checkout) under this tree's key, or in
        `session_dir` (this session's common temp folder) with MLSTM_TEST_RUN_CACHE=0."""
        where = os.environ.get("MLSTM_TEST_RUN_CACHE", str(ROOT / ".test-runs"))
        if where in ("0", "off", ""):
            return cls(session_dir / "runs")
        base, parts = Path(where), key_parts()
        key = _digest(parts)
        prune(base, keep=key)
        (base / key / "key.json").write_text(json.dumps(parts, indent=1))  # what it is a hash of
        return cls(base / key)

    def corpus(self, name: str) -> Path:
        def build(folder: Path) -> None:
            from data_prep.cli import main as prep_main

            assert prep_main(["--out", str(folder / name), *CORPORA[name], *TINY_PREP_ARGS]) == 0

        return self._entry(f"corpus-{name}", build)[0] / name

    def get(self, name: str) -> Run:
        spec = RUNS[name]
        data = self.corpus(spec.corpus)
        source = self.get(spec.start_from).dir if spec.start_from else None
        folder, result = self._entry(name, lambda folder: launch(spec, folder / name, data, source))
        fields = {k: v for k, v in result.items() if k != "commit"}
        return Run(folder / name, subprocess.CompletedProcess(**fields), result.get("commit"))

    def _entry(self, name: str, build: Callable[[Path], dict | None]) -> tuple[Path, dict | None]:
        """(folder, what `build(folder)` returned), built unless a sound copy is there."""
        folder, record = self.root / name, self.root / f"{name}.json"
        with _locked(self.root / f"{name}.lock"):
            if record.exists():
                rec = json.loads(record.read_text())
                seen = self.root / f"{name}.session"
                if seen.exists() and seen.read_text() == self.session:
                    return folder, rec["result"]
                changed = _changes(rec["manifest"], manifest(folder))
                if not changed:
                    seen.write_text(self.session)
                    return folder, rec["result"]
                warnings.warn(f"tests/runs.py: {folder} changed since it was built ({changed}); built again",
                              stacklevel=2)  # fmt: skip
                record.unlink()
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            t0 = time.monotonic()
            result = build(folder)
            rec = {"result": result, "manifest": manifest(folder), "seconds": round(time.monotonic() - t0, 1),
                   "built": time.strftime("%Y-%m-%d %H:%M:%S"), "session": self.session}  # fmt: skip
            tmp = record.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(rec))
            tmp.replace(record)  # the record last, whole: a build cut short has none and is built again
            (self.root / f"{name}.session").write_text(self.session)
        return folder, result


def launch(spec: Spec, out: Path, data: Path, source: Path | None) -> dict:
    """Run `spec` with --out `out` (named after the run: a plot's legend says it), its files beside it ->
    the CompletedProcess's fields. A run that fails raises, so nothing of it is kept."""
    folder = out.parent

    def fill(text: str) -> str:
        return text.replace("{DIR}", str(folder)).replace("{ROOT}", str(ROOT))

    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if source is not None:
        shutil.copytree(source, out, symlinks=True)
    for name, text in spec.files.items():
        (folder / name).write_text(fill(text))
    flags = [fill(f) for f in spec.flags]
    config = ROOT / "ds_configs" / spec.config if spec.config else None
    if spec.procs == 0:
        assert not spec.env and spec.script == "app/train.py" and not spec.runner
        p = train_one_process(data, out, *flags, config=config)
    else:
        p = train(spec.procs, data, out, *flags, stages=spec.stages, config=config, extra_env=spec.env,
                  check=False, script=spec.script, progress=spec.progress, runner=spec.runner)  # fmt: skip
    if p.returncode != 0:
        raise AssertionError(f"run failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    return {
        "args": [str(a) for a in p.args],
        "returncode": p.returncode,
        "stdout": p.stdout,
        "stderr": p.stderr,
        "commit": git.stdout.strip() if git.returncode == 0 else None,
    }


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or its holder dies)
        yield


def manifest(folder: Path) -> dict[str, list]:
    """Every file under `folder`: [size, SHA-256], and every link: ["->", its target]."""
    out: dict[str, list] = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = ["->", os.readlink(path)]
        elif path.is_file():
            out[rel] = [path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()]
    return out


def _changes(want: dict, got: dict) -> str:
    """'' when equal, else a short account of what differs."""
    if want == got:
        return ""
    differ = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
    parts = [f"{len(differ)} changed ({', '.join(differ[:3])})" if differ else "",
             f"{len(want.keys() - got.keys())} gone" if want.keys() - got.keys() else "",
             f"{len(got.keys() - want.keys())} new" if got.keys() - want.keys() else ""]  # fmt: skip
    return ", ".join(p for p in parts if p)


# what a run's bytes can depend on, besides the table itself
# tests/fast_start: a start-up hook the harness may put on a launch's PYTHONPATH (none where it is missing)
KEYED_TREES = ("app", "data_prep", "ds_configs", "tests/fixtures", "tests/fast_start")
KEYED_FILES = ("tests/runs.py", "tests/launcher.py")
KEYED_ENV = ("MLSTM_", "DS_", "TORCH", "OMP_", "MKL_", "KMP_", "CUDA_", "NCCL_", "GLOO_", "WANDB_", "HF_",
             "TRANSFORMERS_", "TOKENIZERS_", "TRITON_", "PYTHON", "LD_", "PATH")  # fmt: skip
UNKEYED_ENV = ("MLSTM_TEST_", "MLSTM_SUITE_SESSION")  # the suite's own switches, the session's id


def key_parts(root: Path = ROOT) -> dict:
    """Everything a run's bytes can depend on (module docstring): the keyed files' digest, and what else."""
    h = hashlib.sha256()
    files = [p for t in KEYED_TREES for p in sorted((root / t).rglob("*")) if "__pycache__" not in p.parts]
    for path in [*files, *(root / f for f in KEYED_FILES)]:
        h.update(str(path.relative_to(root)).encode() + b"\0")
        if path.is_symlink():
            h.update(os.readlink(path).encode())
        elif path.is_file():
            h.update(path.read_bytes())
        h.update(b"\0")
    launched = {k: v for k, v in env().items() if k.startswith(KEYED_ENV) and not k.startswith(UNKEYED_ENV)}
    # pytest-xdist's workers put the checkout first on PYTHONPATH: the same code as a run without them
    paths = launched.pop("PYTHONPATH", "").split(os.pathsep)
    launched["PYTHONPATH"] = [p for p in paths if p and Path(p).resolve() != ROOT]
    cxx = shutil.which("c++")  # the fused core's compiler
    return {
        "files": h.hexdigest(),
        "checkout": str(root),
        "python": [sys.version, sys.executable],
        "platform": platform.platform(),
        "cpu": [_cpu(), os.cpu_count()],
        "compiler": subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout[:200]
        if cxx
        else "",
        "environment": launched,
        "distributions": sorted(
            f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
        ),
    }


def tree_key(root: Path = ROOT) -> str:
    """A hash of `key_parts`, 16 hex digits."""
    return _digest(key_parts(root))


def _digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _cpu() -> str:
    """The CPU's model and instruction-set flags (the kernels a run takes depend on them)."""
    try:
        info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return platform.processor()
    return "\n".join(ln for ln in info.splitlines() if ln.startswith(("model name", "flags")))


def prune(base: Path, keep: str, newest: int = 3, idle_s: float = 3600.0) -> None:
    """Remove the key folders beyond the `newest` used, once idle for `idle_s` (a session of another tree
    may still be reading its own)."""
    base.mkdir(parents=True, exist_ok=True)
    (base / keep).mkdir(exist_ok=True)
    os.utime(base / keep)
    folders = sorted((p for p in base.iterdir() if p.is_dir()), key=lambda p: -p.stat().st_mtime)
    for old in folders[newest:]:
        if old.name != keep and time.time() - old.stat().st_mtime > idle_s:
            shutil.rmtree(old, ignore_errors=True)
