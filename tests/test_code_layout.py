"""The house rules: imports point down (no circles), small functions, thin entry points, tests that mirror
modules.

Layers, bottom to top; a module imports only from lower layers or from its own folder (without circles):
    0 app.common
    1 app.model, data_prep (a sibling tool: it may use app.common only)
    2 app.parallel
    3 app.checkpoints, app.batching (a prepared split as batches: the trainer's and the evaluator's)
    4 app.generation (the trainer samples text at each validation)
    5 app.evaluation (the trainer's validation passes are its held-out scoring), app.classifier (a kept
      classifier's folder, head and features: what app.probing keeps and app.classifying runs)
    6 app.training, app.probing
    7 app.classifying (labelling new text with the classifier app.probing keeps)
    8 the entry points app/train.py, evaluate.py, generate.py, export.py, transfer.py, plot.py, import_weights.py,
      classify.py
Every import counts, function-level ones included (they are how a circle hides).
No function in app/, data_prep/ or bench/ is over MAX_FUNCTION_LINES: a long one is split into named steps.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {
    "app.common": 0,
    "app.model": 1,
    "data_prep": 1,
    "app.parallel": 2,
    "app.checkpoints": 3,
    "app.batching": 3,
    "app.generation": 4,
    "app.evaluation": 5,
    "app.classifier": 5,
    "app.training": 6,
    "app.probing": 6,
    "app.classifying": 7,
}
ENTRY_POINTS = (
    "app.train", "app.evaluate", "app.generate", "app.export", "app.transfer", "app.plot", "app.import_weights",
    "app.classify",
)  # fmt: skip
ENTRY_LAYER = max(LAYERS.values()) + 1
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(mod: str) -> str:
    """The layer a module belongs to: its folder (app.<folder>, data_prep) or the entry point itself."""
    if mod in ENTRY_POINTS or mod == "app":
        return mod
    for pkg in LAYERS:
        if mod == pkg or mod.startswith(pkg + "."):
            return pkg
    raise AssertionError(f"{mod}: not in any layer; add its folder to LAYERS")


def layer_of(mod: str) -> int:
    pkg = package_of(mod)
    return ENTRY_LAYER if pkg in ENTRY_POINTS else -1 if pkg == "app" else LAYERS[pkg]


def project_sources() -> list[Path]:
    return sorted([*(ROOT / "app").rglob("*.py"), *(ROOT / "data_prep").rglob("*.py")])


def imports_of(path: Path, mods: set[str]) -> set[str]:
    """Project modules `path` imports (`from a.b import c` counts a.b.c when that is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods}
    return {m for m in out if m in mods and m != "app"}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in project_sources()}
    mods = set(files)
    # an import of a package is an import of its __init__, which must stay free of project imports
    return {m: imports_of(p, mods) - {m} for m, p in files.items()}


def test_imports_point_down():
    bad = []
    for mod, deps in import_graph().items():
        for dep in deps:
            same_folder = package_of(mod) == package_of(dep)
            if not same_folder and layer_of(dep) >= layer_of(mod):
                bad.append(f"{mod} (layer {layer_of(mod)}) imports {dep} (layer {layer_of(dep)})")
    assert not bad, "imports that do not point down:\n" + "\n".join(sorted(bad))


def test_no_import_circle():
    graph = import_graph()
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return [*path[path.index(d) :], d]
            if d not in state and (cycle := visit(d)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_checker_sees_a_violation(tmp_path):
    """The checks above can fail: a model module importing the trainer is caught."""
    fake = tmp_path / "bad.py"
    fake.write_text("def f():\n    from app.training.trainer import Trainer\n")
    mods = {module_name(p) for p in project_sources()}
    deps = imports_of(fake, mods)
    assert "app.training.trainer" in deps and layer_of("app.training.trainer") > layer_of("app.model.lm")


def long_functions(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.relative_to(ROOT)}:{n.lineno} {n.name} is {n.end_lineno - n.lineno + 1} lines"
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno - n.lineno + 1 > limit
    ]


def test_no_function_over_80_lines():
    sources = sorted(p for folder in ("app", "data_prep", "bench") for p in (ROOT / folder).rglob("*.py"))
    bad = [line for p in sources for line in long_functions(p, MAX_FUNCTION_LINES)]
    assert not bad, "\n".join(bad)


def test_entry_point_and_trainer_are_short():
    """The train verb is thin, the Trainer reads in one sitting, and its loop in one screen."""
    assert len((ROOT / "app" / "train.py").read_text().splitlines()) <= 60
    trainer = (ROOT / "app" / "training" / "trainer.py").read_text()
    assert len(trainer.splitlines()) <= 400
    tree = ast.parse(trainer)
    fit = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "fit")
    assert fit.end_lineno - fit.lineno + 1 <= 80


# tests of a behaviour across modules (a folder's end to end, the launch scripts, the house rules), named for it
TOPIC_TESTS = {
    "code_layout", "compat_main", "console_scripts", "data_prep_e2e", "docs", "data_prep_formats", "data_prep_hostile",
    "data_prep_resume", "data_prep_units", "export_hf", "fast_start", "launch", "lifecycle", "multinode", "slurm",
    "suite",
}  # fmt: skip


def mirrors_a_module(name: str) -> bool:
    """`name` (a test file's, without test_ and .py) is an entry point, a folder of app/, <folder>_<module>
    for app/<folder>/<module>.py or data_prep/<module>.py, or bench_<script> for a bench/ script."""
    if f"app.{name}" in ENTRY_POINTS or (ROOT / "app" / name / "__init__.py").is_file():
        return True
    if name.startswith("data_prep_"):
        return (ROOT / "data_prep" / f"{name.removeprefix('data_prep_')}.py").is_file()
    if name.startswith("bench_"):
        return any((ROOT / "bench").glob(f"{name.removeprefix('bench_')}.*"))
    folder, _, module = name.partition("_")
    return bool(module) and (ROOT / "app" / folder / f"{module}.py").is_file()


def test_tests_mirror_modules():
    """tests/test_<folder>_<module>.py tests app/<folder>/<module>.py (a moved or renamed module takes its
    test's name with it), test_<verb>.py an entry point; anything else is a topic named in TOPIC_TESTS."""
    names = [p.stem.removeprefix("test_") for p in sorted((ROOT / "tests").glob("test_*.py"))]
    stray = [f"tests/test_{n}.py" for n in names if n not in TOPIC_TESTS and not mirrors_a_module(n)]
    assert not stray, (
        "tests named after no module (rename after the module they test, or a topic):\n" + "\n".join(stray)
    )
    assert mirrors_a_module("evaluation_cache") and not mirrors_a_module("training_cache_eval")


def code_map() -> str:
    """The Code map section of docs/development.md (up to the next heading)."""
    text = (ROOT / "docs" / "development.md").read_text()
    start = text.index("## Code map")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_the_code_map_matches_the_tree():
    """docs/development.md's Code map names every folder of app/ and every entry point, each as it is on
    disk, and every `app/...` path it names exists (a moved or removed module takes its line with it)."""
    text = code_map()
    folders = sorted(p.parent.name for p in (ROOT / "app").glob("*/__init__.py"))
    missing = [f"app/{f}/" for f in folders if f"`app/{f}/`" not in text]
    entry = [m.removeprefix("app.") for m in ENTRY_POINTS]
    missing += [f"app/{e}.py" for e in entry if f"`{e}.py`" not in text and f"`app/{e}.py`" not in text]
    assert not missing, "the Code map (docs/development.md) does not name: " + ", ".join(missing)
    named = set(re.findall(r"`((?:app|data_prep)/[\w/.]*)`", text))
    gone = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert not gone, "the Code map names paths that do not exist: " + ", ".join(gone)
    modules = set(re.findall(r"`(\w+)`", text))
    for folder in folders:  # a module named in a folder's line exists in that folder
        line = next(ln for ln in text.split("\n- ") if ln.startswith(f"`app/{folder}/`"))
        stray = [
            m for m in set(re.findall(r"`(\w+)`", line)) & modules
            if m.islower() and not any((ROOT / "app" / folder).rglob(f"{m}.py")) and not (ROOT / "app" / folder / m).is_dir()
            and m not in KNOWN_WORDS
        ]  # fmt: skip
        assert not stray, f"app/{folder}/'s line in the Code map names modules it does not hold: {stray}"


# backticked words in the Code map that are not module names (a class, a key, a package)
KNOWN_WORDS = {"transfer"}  # the `transfer` extra


IMPORT_SYSTEM = ("modules", "meta_path", "path_hooks")
MUTATORS = ("insert", "append", "extend", "remove", "pop", "popitem", "update", "setdefault", "clear",
            "__setitem__", "__delitem__")  # fmt: skip


def import_system_edits(path: Path) -> list[str]:
    """Where `path` changes what Python imports: an item of `sys.modules` / `sys.meta_path` / `sys.path_hooks`
    set or deleted, one of their mutating methods called, or the name rebound."""

    def is_sys(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr in IMPORT_SYSTEM
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )

    out = []
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        stored = isinstance(getattr(n, "ctx", None), ast.Store | ast.Del)
        if (
            (isinstance(n, ast.Subscript) and stored and is_sys(n.value))
            or (stored and is_sys(n))
            or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS
                and is_sys(n.func.value))
        ):  # fmt: skip
            out.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{n.lineno}")
    return out


def test_no_stand_in_in_the_import_system(tmp_path):
    """Product code uses torch and DeepSpeed as they are: nothing in app/ or data_prep/ puts a module into
    `sys.modules` or a finder into `sys.meta_path` (a start-up saving that needs one lives in the test harness:
    tests/fast_start)."""
    bad = [where for p in project_sources() for where in import_system_edits(p)]
    assert not bad, "edits of the import system in product code:\n" + "\n".join(bad)
    fake = tmp_path / "bad.py"
    fake.write_text(
        "import sys\nsys.modules['torch._dynamo'] = 1\ndel sys.modules['x']\nsys.meta_path.insert(0, 1)\n"
        "sys.modules.setdefault('y', 2)\nsys.meta_path = []\nok = sys.modules.get('z')\n"
    )
    assert [w.rsplit(":", 1)[1] for w in import_system_edits(fake)] == ["2", "3", "4", "5", "6"]
