"""The house rules of app/: imports point down (no circles), small functions, thin entry points.

Layers, bottom to top; a module imports only from lower layers or from its own folder (without circles):
    0 app.common
    1 app.model, data_prep (a sibling tool: it may use app.common only)
    2 app.parallel
    3 app.checkpoints, app.batching (a prepared split as batches: the trainer's and the evaluator's)
    4 app.generation (the trainer samples text at each validation)
    5 app.evaluation (the trainer's validation passes are its held-out scoring)
    6 app.training, app.probing
    7 the entry points app/train.py, evaluate.py, generate.py, export.py, transfer.py, plot.py
Every import counts, function-level ones included (they are how a circle hides).
"""

from __future__ import annotations

import ast
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
    "app.training": 6,
    "app.probing": 6,
}
ENTRY_POINTS = ("app.train", "app.evaluate", "app.generate", "app.export", "app.transfer", "app.plot")
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
    return 7 if pkg in ENTRY_POINTS else -1 if pkg == "app" else LAYERS[pkg]


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


def test_no_function_in_app_over_80_lines():
    bad = [
        line for p in sorted((ROOT / "app").rglob("*.py")) for line in long_functions(p, MAX_FUNCTION_LINES)
    ]
    assert not bad, "\n".join(bad)


def test_entry_point_and_fit_loop_are_short():
    assert len((ROOT / "app" / "train.py").read_text().splitlines()) <= 60
    tree = ast.parse((ROOT / "app" / "training" / "trainer.py").read_text())
    fit = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "fit")
    assert fit.end_lineno - fit.lineno + 1 <= 80
