"""`pytest --timings FILE`: what every test took, in wall-clock seconds and in CPU seconds, written as JSON.

A test's CPU seconds are its process's own (user + system) and those of every child process it waited
for (resource.getrusage's RUSAGE_CHILDREN: a launch's ranks count once their launcher has waited for them;
daemons a fixture leaves running, as the test clusters' sshd and Slurm, count when they are stopped).
Setup, call and teardown are counted together, as `--durations` counts them: a session fixture's build
is charged to the first test that asked for it.

The file holds, per test file, the tests run and their seconds summed (what tests/tiers.py orders the files
by, longest first), and per test its two figures, when it started (seconds into the session) and the
pytest-xdist worker that ran it; with it, the command and the machine it came from.
tests/durations.json is this file written by a whole run (docs/development.md, Tests, says how to
refresh it).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import pytest

_CPU_KEY = "cpu_s"
_PHASE_KEYS = {when: pytest.StashKey[float]() for when in ("setup", "call", "teardown")}


def _cpu_now() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--timings",
        metavar="FILE",
        default=None,
        help="write every test's wall-clock and CPU seconds (its own and its children's) to FILE as JSON",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries the CPU seconds the phase took (a user property: pytest-xdist sends it
    from the worker to the controller with the report)."""
    outcome = yield
    report = outcome.get_result()
    started = item.stash.get(_PHASE_KEYS[call.when], None)
    if started is not None:
        report.user_properties.append((_CPU_KEY, round(_cpu_now() - started, 3)))


def _noted(when: str):
    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def hook(item, *args):
        item.stash[_PHASE_KEYS[when]] = _cpu_now()
        yield

    return hook


pytest_runtest_setup = _noted("setup")
pytest_runtest_call = _noted("call")
pytest_runtest_teardown = _noted("teardown")


class Recorder:
    """In the process that reports (pytest-xdist's controller, or the one process): sums each test's
    phases and writes the file at the end of the session."""

    def __init__(self, config, path: Path) -> None:
        self.config, self.path = config, path
        self.tests: dict[str, list] = {}  # node id -> [wall s, CPU s, started (s into the session), worker]
        self.outcomes: dict[str, str] = {}
        self.start, self.epoch = time.monotonic(), time.time()

    def pytest_runtest_logreport(self, report) -> None:
        node = getattr(report, "node", None)  # pytest-xdist's worker that ran it
        worker = node.gateway.id if node is not None else "-"
        row = self.tests.setdefault(report.nodeid, [0.0, 0.0, round(report.start - self.epoch, 1), worker])
        row[0] += report.duration
        row[1] += dict(report.user_properties).get(_CPU_KEY, 0.0)
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.nodeid] = report.outcome

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        files: dict[str, dict] = {}
        for nodeid, (wall, cpu, _, _) in self.tests.items():
            f = files.setdefault(nodeid.split("::")[0], {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0})
            f["tests"] += 1
            f["wall_s"] += wall
            f["cpu_s"] += cpu
        doc = {
            "written_by": "pytest --timings (tests/timings.py)",
            "command": " ".join(["pytest", *self.config.invocation_params.args]),
            "machine": machine(),
            "date": datetime.date.today().isoformat(),
            "workers": getattr(self.config.option, "numprocesses", None) or 0,
            "every_tier": os.environ.get("MLSTM_TEST_ALL") == "1",  # launch/test.sh --all
            "session_wall_s": round(time.monotonic() - self.start, 1),
            "tests": len(self.tests),
            "outcomes": {
                o: list(self.outcomes.values()).count(o) for o in sorted(set(self.outcomes.values()))
            },
            "files": {
                name: {k: round(v, 2) if isinstance(v, float) else v for k, v in f.items()}
                for name, f in sorted(files.items(), key=lambda kv: -kv[1]["wall_s"])
            },
            "per_test": {
                nodeid: [round(wall, 2), round(cpu, 2), started, worker]
                for nodeid, (wall, cpu, started, worker) in sorted(
                    self.tests.items(), key=lambda kv: -kv[1][0]
                )
            },
        }
        self.path.write_text(json.dumps(doc, indent=1) + "\n")


def machine() -> str:
    """The CPU model, its cores and the Python: where the figures were measured."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"


def pytest_configure(config) -> None:
    path = config.getoption("--timings")
    if path and not hasattr(config, "workerinput"):  # a pytest-xdist worker sends its reports on instead
        config.pluginmanager.register(Recorder(config, Path(path)), "timings-recorder")
