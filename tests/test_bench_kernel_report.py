"""bench/kernel_report.py: every GPU kernel configuration the tuner can choose, built by Triton's real compiler for
sm_90 (H100/H200), sm_89 (L40S/4090/L4) and sm_80 (A100) with no GPU present.

The whole set (about 1100 builds: every preset width x batch bucket x dtype x loop x launch, on the SM counts of
those GPUs) takes about an hour on 2 cores, too long for the suite: `python bench/kernel_report.py --save` keeps
it in bench/results/kernel_report.json (REPORT). These tests check that REPORT was made from today's kernel
source and covers exactly the configurations the tuner can choose today, that none of them spills and that on
sm_90 every product with M >= 64 and 16-bit (or tf32) operands is a warpgroup MMA; and they rebuild the most
register-hungry configurations of each architecture with the Triton installed here, so the report cannot drift
from what the compiler does (register counts must match where the Triton release is the report's).
`MLSTM_KERNEL_REPORT_ALL=1` rebuilds every configuration instead (an hour)."""

import json
import os
import sys

import pytest
from launcher import ROOT

sys.path.append(str(ROOT / "bench"))  # after the root: bench/data_prep.py must not hide the package
triton = pytest.importorskip("triton", reason="the gpu extra (triton) is not installed")
import kernel_report as kr  # noqa: E402  (bench/kernel_report.py)

ARCHS = (90, 89, 80)


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(kr.REPORT.read_text())


@pytest.fixture(scope="module")
def today() -> dict:
    """key -> configuration, as the tuner's code makes them now."""
    out = {}
    for arch in ARCHS:
        out.update({entry["key"]: entry for entry in kr.configurations(arch).values()})
    return out


def test_the_report_is_of_todays_kernels_and_covers_every_configuration(report, today):
    assert report["source"] == kr.source_hash(), (
        "the kernels changed: rerun `python bench/kernel_report.py --save`"
    )
    got = {b["key"] for b in report["builds"]}
    missing, extra = set(today) - got, got - set(today)
    assert not missing and not extra, (
        f"{len(missing)} configurations the tuner can choose are not in the report (e.g. "
        f"{[today[k]['uses'][0] for k in list(missing)[:3]]}), {len(extra)} are no longer chosen: rerun "
        "`python bench/kernel_report.py --save`"
    )
    assert set(report["archs"]) == set(ARCHS) and len(got) > 500


def test_no_configuration_spills_and_sm90_products_are_warpgroup_mmas(report):
    builds = report["builds"]
    bad = kr.problems(builds)
    assert not bad["spills"], [(b["spill_bytes"], b["uses"][0]) for b in bad["spills"]][:10]
    assert not bad["wgmma_missing"], [(b["dots"], b["uses"][0]) for b in bad["wgmma_missing"]][:10]
    sm90 = [b for b in builds if b["arch"] == 90 and b["tensor_cores"]]
    assert sum(d["wgmma"] for b in sm90 for d in b["dots"]) > 100  # the rule is not vacuous
    # every product's K loop is software-pipelined (asynchronous copies): the split's sum phase has no product
    assert all(b["pipelined"] for b in builds if b["dots"]), [
        b["uses"][0] for b in builds if b["dots"] and not b["pipelined"]
    ]


def test_the_hot_products_are_reported_and_the_l2_tiles_all_at_m64_on_wgmma(report):
    """At the large model's shapes (H4096, B128 and B256, 16-bit operands, sm_90): every product of M >= 64 is
    a warpgroup MMA, every product of the re-tiled candidate (persistent-l2) has M >= 64, and bench/README.md
    states the share of M >= 64 among all the candidates' products there, as the report has it."""
    hot = kr.hot_products(report["builds"])
    n, m64, wgmma = hot["all"]
    assert n > 0 and m64 == wgmma, hot
    l2 = hot["persistent-l2"]
    assert l2[0] > 0 and l2[0] == l2[1] == l2[2], hot
    readme = (ROOT / "bench" / "README.md").read_text()
    assert f"{m64} of {n} hot products at M >= 64" in readme, (
        "bench/README.md's kernel report summary is stale"
    )


def _hungriest(report: dict, today: dict) -> list[dict]:
    if os.environ.get("MLSTM_KERNEL_REPORT_ALL") == "1":
        return [today[b["key"]] for b in report["builds"] if b["key"] in today]
    picked = []
    for arch in ARCHS:
        mine = sorted(
            (b for b in report["builds"] if b["arch"] == arch), key=lambda b: -(b["registers"] or 0)
        )
        picked += [today[b["key"]] for b in mine[:1] if b["key"] in today]
    return picked


def test_the_hungriest_configurations_build_as_reported(report, today, tmp_path, monkeypatch):
    """The configuration with the most registers on each architecture, rebuilt here by Triton's compiler."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    saved = {b["key"]: b for b in report["builds"]}
    for entry in _hungriest(report, today):
        got = kr.build(entry)
        assert got["spill_bytes"] == 0, (got["spill_bytes"], entry["uses"][0])
        if triton.__version__ == report["triton"]:
            assert got["registers"] == saved[entry["key"]]["registers"], entry["uses"][0]
            assert got["dots"] == saved[entry["key"]]["dots"], entry["uses"][0]
