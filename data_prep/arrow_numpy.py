"""Arrow arrays as NumPy and back without pyarrow's `to_numpy` and `pyarrow.array`, which import pandas on
first use: over half a second in every rank of every launch, for arrays that are plain buffers."""

from __future__ import annotations

import numpy as np


def view(array) -> np.ndarray:
    """A fixed-width Arrow array (or a chunked one) as NumPy: zero-copy for one chunk without nulls.

    A list array's `.offsets` and `.values` are such arrays. An array with nulls, or of another type,
    takes pyarrow's own conversion."""
    chunks = getattr(array, "chunks", None)
    if chunks is not None:
        parts = [view(c) for c in chunks]
        return parts[0] if len(parts) == 1 else np.concatenate([*parts, _empty(array.type)])
    dtype = _dtype(array.type)
    if dtype is None or array.null_count:
        return array.to_numpy(zero_copy_only=False)
    data = array.buffers()[1]
    if data is None:  # an empty array may carry no data buffer
        return np.zeros(0, dtype)
    return np.frombuffer(data, dtype=dtype, count=array.offset + len(array))[array.offset :]


def int32_array(values: np.ndarray):
    """(n,) int32 NumPy -> an Arrow array over the same memory (`pyarrow.array` would import pandas)."""
    import pyarrow as pa

    values = np.ascontiguousarray(values, dtype=np.int32)
    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])


def _dtype(arrow_type) -> np.dtype | None:
    name = str(arrow_type)
    if name in {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float", "double"}:
        return np.dtype({"float": "float32", "double": "float64"}.get(name, name))
    return None


def _empty(arrow_type) -> np.ndarray:
    return np.zeros(0, _dtype(arrow_type) or np.float64)
