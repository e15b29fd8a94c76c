"""data_prep/arrow_numpy.py: Arrow <-> NumPy without pyarrow's pandas-importing conversions, and a run's
reading of a prepared split that imports neither `datasets` nor pandas (each rank of each launch paid ~2 s)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from data_prep import arrow_numpy


@pytest.mark.parametrize("arrow_type", [pa.int32(), pa.int64(), pa.uint32(), pa.float32(), pa.float64()])
def test_views_equal_pyarrows_conversion_on_random_slices_and_chunks(arrow_type):
    rng = np.random.default_rng()
    for _ in range(20):
        n = int(rng.integers(0, 50))
        values = rng.integers(0, 1 << 30, n).astype(arrow_type.to_pandas_dtype())
        array = pa.array(values, arrow_type)
        lo = int(rng.integers(0, n + 1))
        hi = int(rng.integers(lo, n + 1))
        part = array.slice(lo, hi - lo)
        np.testing.assert_array_equal(arrow_numpy.view(part), part.to_numpy(zero_copy_only=False))
        chunked = pa.chunked_array([array, part], arrow_type)
        np.testing.assert_array_equal(arrow_numpy.view(chunked), chunked.to_numpy())
        assert arrow_numpy.view(part).dtype == part.to_numpy(zero_copy_only=False).dtype


def test_list_offsets_and_values_of_a_sliced_list_array():
    lists = pa.array([[1, 2], [3], [], [4, 5, 6]], pa.list_(pa.int32())).slice(1, 3)
    offsets, values = arrow_numpy.view(lists.offsets), arrow_numpy.view(lists.values)
    got = [values[offsets[i] : offsets[i + 1]].tolist() for i in range(len(lists))]
    assert got == lists.to_pylist() == [[3], [], [4, 5, 6]]


def test_nulls_and_other_types_take_pyarrows_conversion():
    np.testing.assert_array_equal(arrow_numpy.view(pa.array([1, None], pa.int64())), [1.0, np.nan])
    assert arrow_numpy.view(pa.array(["a"])).tolist() == ["a"]


def test_int32_array_round_trips():
    values = np.random.default_rng().integers(-(1 << 31), 1 << 31, 1000, dtype=np.int64)
    array = arrow_numpy.int32_array(values.astype(np.int32))
    assert array.type == pa.int32() and array.to_pylist() == values.astype(np.int32).tolist()


def test_reading_a_split_for_a_run_imports_neither_datasets_nor_pandas(prepared_dir):
    """What every training and evaluation rank does with --data: load, check and bucket a split."""
    code = (
        "import sys\n"
        "from data_prep.format import load_prepared\n"
        "from app.batching.buckets import TokenStore\n"
        f"store = TokenStore(load_prepared({str(prepared_dir)!r}).table('train'))\n"
        "assert len(store) > 0 and store.ids(0).size > 0\n"
        "print(sorted(m for m in ('datasets', 'pandas') if m in sys.modules))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split("\n")[-2] == "[]", p.stdout


def test_the_table_and_the_dataset_of_a_split_hold_the_same_store(prepared_dir):
    from app.batching.buckets import TokenStore
    from data_prep.format import load_prepared

    data = load_prepared(prepared_dir)
    for split in ("train", "validation", "test"):
        a, b = TokenStore(data.table(split)), TokenStore(data.split(split))
        for field in ("lengths", "num_bytes", "buckets", "doc_ids"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        for i in range(len(a)):
            np.testing.assert_array_equal(a.ids(i), b.ids(i))
