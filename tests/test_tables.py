"""The column helpers of trace/tables.py give what numpy's own functions give (they are faster forms of them)."""

import numpy as np
import pytest

from decodegap.trace.tables import group_rows, isin, unique


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_unique_and_isin_are_numpys(n, dtype):
    rng = np.random.default_rng(n)
    values = rng.integers(-5, 50, n).astype(dtype)
    test = rng.integers(-3, 60, int(rng.integers(0, 80)))
    assert np.array_equal(unique(values), np.unique(values)) and unique(values).dtype == np.unique(values).dtype
    assert np.array_equal(isin(values, test), np.isin(values, test))
    assert np.array_equal(isin(values, test.tolist()), np.isin(values, test.tolist()))
    assert np.array_equal(isin(values, []), np.isin(values, []))


@pytest.mark.parametrize("n", [0, 1, 5, 3000])
def test_group_rows_is_np_unique_by_rows(n):
    rng = np.random.default_rng(n)
    columns = [rng.integers(-2, 4, n), rng.integers(0, 3, n).astype(np.int32), rng.integers(0, 2, n).astype(bool)]
    first, group, counts = group_rows(*columns)
    rows = np.stack([c.astype(np.int64) for c in columns], axis=1) if n else np.empty((0, 3), np.int64)
    distinct, want_first, want_group, want_counts = np.unique(rows, axis=0, return_index=True, return_inverse=True,
                                                              return_counts=True)
    assert np.array_equal(first, want_first) and np.array_equal(counts, want_counts)
    assert np.array_equal(group, want_group.reshape(-1))
    assert np.array_equal(rows[first], distinct)
