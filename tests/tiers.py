"""The suite's tiers and order (a pytest plugin, loaded by tests/conftest.py).

Tiers (pyproject.toml's markers): the default run is the unit tests and one launched run of each kind;
`long` (minutes for a case the default run covers in part) and `cluster` (real sshd/pdsh and Slurm
clusters, and runs driven by real clocks and signals) are left out of it and counted, unless
MLSTM_TEST_ALL=1 (`launch/test.sh --all`, which CI runs), a -m expression names the tier, or a test is
named by its node id.

Order: the files whose tests (those this run runs) took longest in tests/durations.json (`pytest
--timings`, tests/timings.py) run first, a file with no test in it before them all: the suite runs in pytest-xdist workers one file at a time
(launch/test.sh), and a long file dealt last would leave one worker running it alone while the other has
nothing left.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

TIERS = ("long", "cluster")
DURATIONS = Path(__file__).resolve().parent / "durations.json"
COLLECTED = pytest.StashKey[list[str]]()  # every node id collected, before any deselection
_LEFT_OUT = pytest.StashKey[dict[str, int]]()


def test_seconds(path: Path = DURATIONS) -> dict[str, float]:
    """node id -> the wall-clock seconds the durations file recorded for the test."""
    try:
        tests = json.loads(path.read_text())["per_test"]
    except (OSError, ValueError, KeyError):
        return {}
    return {nodeid: float(row[0]) for nodeid, row in tests.items()}


def order(items: list, seconds: dict[str, float]) -> None:
    """Longest file first, a file's length being the recorded seconds of the tests of it this run runs (a
    tier left out counts for nothing); a file the durations know no test of before them all; a file's own
    order kept."""
    files: dict[str, float] = {}
    for item in items:
        name = item.nodeid.split("::")[0]
        if item.nodeid in seconds:
            files[name] = files.get(name, 0.0) + seconds[item.nodeid]
    first = max(files.values(), default=0.0) + 1.0

    def key(item) -> float:
        return -files.get(item.nodeid.split("::")[0], first)

    items.sort(key=key)  # stable


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Before -k and -m deselect: what was collected (tests/test_suite.py checks tests/ID_MAP.tsv
    against it)."""
    config.stash[COLLECTED] = [item.nodeid for item in items]


def leave_out_tiers(config, items: list) -> None:
    """Deselect the `long` and `cluster` tiers from a default run, counting each (tests/conftest.py calls
    it after -k and -m have deselected: the counts are of the tests they left)."""
    every = os.environ.get("MLSTM_TEST_ALL") == "1" or any("::" in a for a in config.args)
    left: dict[str, int] = {}
    for tier in TIERS:
        if every or tier in (config.option.markexpr or ""):
            continue
        out = [item for item in items if item.get_closest_marker(tier) is not None]
        if out:
            config.hook.pytest_deselected(items=out)
            items[:] = [item for item in items if item.get_closest_marker(tier) is None]
        left[tier] = len(out)
    config.stash[_LEFT_OUT] = left
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: its controller says it
        config.workeroutput["tiers_left_out"] = left


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller, as a worker ends: how many tests of each tier it left out (every worker
    collects every test)."""
    left = getattr(node, "workeroutput", {}).get("tiers_left_out")
    if left is not None:
        node.config.stash[_LEFT_OUT] = left


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Said at the end of every default run: how many tests of each tier it left out, and how to run them."""
    left = {tier: n for tier, n in config.stash.get(_LEFT_OUT, {}).items() if n}
    if left:
        said = " and ".join(f"{n} {tier}" for tier, n in left.items())
        terminalreporter.write_line(f"{said} test(s) left out of this run (pyproject.toml's markers): "
                                    "./launch/test.sh --all runs every test")  # fmt: skip
