"""Evaluation: the mean validation loss (and accuracy) of a parameter tree over fixed evaluation batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from multilevel.train.step import put_batch


class Evaluator:
  """``Evaluator(eval_batches, mesh)(eval_fn, params) -> {'eval_loss', 'eval_accuracy'}``.

  ``eval_batches()`` returns a fresh iterable over the same validation batches each call; ``eval_fn`` is a jitted
  ``(params, batch, index) -> {'loss_sum', 'count', 'correct'}`` (``multilevel.train.eval_step``). Sums are added
  on device and fetched once, so the mean is exact over batches and devices.
  """

  def __init__(self, eval_batches, mesh):
    self._batches = eval_batches
    self._mesh = mesh

  def __call__(self, eval_fn, params) -> dict[str, float]:
    total = None
    for i, batch in enumerate(self._batches()):
      sums = eval_fn(params, put_batch(batch, self._mesh), jnp.int32(i))
      total = sums if total is None else jax.tree.map(jnp.add, total, sums)
    if total is None:
      raise ValueError("The evaluation set is empty: give the data more validation examples (data.val_fraction).")
    total = jax.device_get(total)
    n = max(float(total["count"]), 1.0)
    return {"eval_loss": float(total["loss_sum"]) / n, "eval_accuracy": float(total["correct"]) / n}
