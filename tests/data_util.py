"""Helpers shared by the data tests."""

import numpy as np


def take(it, n):
  """The next ``n`` batches of an iterator."""
  return [next(it) for _ in range(n)]


def assert_same_batches(a, b):
  """Two lists of batches hold the same keys and identical arrays."""
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
