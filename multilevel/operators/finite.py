"""Refusing parameter trees that hold NaN or infinity before an operator maps them.

A non-finite value would not stay where it is: coalescing averages it into every unit of its group (and an infinity
comes back as NaN, ``inf - inf``), interpolation blends it into the next level, and training goes on from there.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from multilevel.tree import flatten


@jax.jit
def _finite_flags(leaves):
  # One compiled program per tree signature: an all(isfinite) per leaf, fused by XLA, and one small transfer back.
  return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


def first_nonfinite(tree: Mapping) -> str | None:
  """The path of the first parameter of ``tree`` (in path order) that holds a NaN or an infinity, else None.

  One reduction over the tree on concrete arrays (sharded ones too: the flags come back replicated). Under
  ``jax.jit`` (or any other transformation) the values are tracers that cannot be inspected at trace time: None.
  """
  flat = flatten(tree)
  names = sorted(flat)
  leaves = [flat[n] for n in names]
  if not leaves or any(isinstance(x, jax.core.Tracer) for x in leaves):
    return None
  if any(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):
    raise TypeError("The tree holds shapes (jax.ShapeDtypeStruct, e.g. models.abstract_params), not values: to map "
                    "shapes only, run the operator under jax.eval_shape (with check_finite=False); to map values, "
                    "give arrays.")
  flags = _finite_flags(leaves)
  if isinstance(flags, jax.core.Tracer):  # Concrete arrays closed over by a function being traced.
    return None
  flags = np.asarray(flags)
  return None if flags.all() else names[int(np.argmin(flags))]


def require_finite(tree: Mapping, what: str) -> None:
  """Raises ValueError naming the first parameter of ``tree`` (in path order) that holds a NaN or an infinity
  (``first_nonfinite``); nothing is checked under a transformation."""
  name = first_nonfinite(tree)
  if name is None:
    return
  x = np.asarray(flatten(tree)[name])
  raise ValueError(f"Parameter {name!r} of {what} holds {int(np.isnan(x).sum())} NaN and {int(np.isinf(x).sum())} "
                   f"infinite values (the first such parameter in path order). A tree like this most likely comes "
                   f"from a run that diverged: look at the loss before this point, or go back to an earlier "
                   f"checkpoint. To map it anyway, pass check_finite=False.")
