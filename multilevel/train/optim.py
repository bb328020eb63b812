"""AdamW with warm-up and decay from optax, gradient clipping, and the decay mask of BERT/GPT practice."""

from __future__ import annotations

import dataclasses

import jax
import optax

from multilevel.tree import flatten, unflatten

DECAYS = ("linear", "cosine", "constant")


@dataclasses.dataclass(frozen=True)
class LrSchedule:
  """Peak learning rate, linear warm-up steps, then decay over the rest of ``steps`` (to ``end_frac * peak``)."""

  peak: float
  steps: int
  warmup: int = 0
  decay: str = "linear"
  end_frac: float = 0.0

  def __post_init__(self):
    if self.decay not in DECAYS:
      raise ValueError(f"Learning-rate decay must be one of {DECAYS}, got {self.decay!r}.")
    if self.steps < 1 or not 0 <= self.warmup <= self.steps:
      raise ValueError(f"Bad schedule: {self.steps} steps with {self.warmup} warm-up steps.")
    if not self.peak > 0:
      raise ValueError(f"The peak learning rate must be positive, got {self.peak}.")

  def build(self) -> optax.Schedule:
    rest = self.steps - self.warmup
    end = self.peak * self.end_frac
    parts, bounds = [], []
    if self.warmup:
      parts.append(optax.linear_schedule(0.0, self.peak, self.warmup))
      bounds.append(self.warmup)
    if self.decay == "constant" or rest == 0:
      parts.append(optax.constant_schedule(self.peak))
    elif self.decay == "linear":
      parts.append(optax.linear_schedule(self.peak, end, rest))
    else:
      parts.append(optax.cosine_decay_schedule(self.peak, rest, alpha=self.end_frac))
    return optax.join_schedules(parts, bounds) if bounds else parts[0]


def decay_mask(params):
  """Weight decay on kernels and embedding tables only; never on biases, LayerNorm or the CLS/position vectors."""
  flat = flatten(params)
  keep = {k: k.endswith("kernel") or k.endswith("embedding") or k in ("position", "token_type") for k in flat}
  return unflatten(keep)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW (HF Trainer defaults) with global-norm clipping; hashable, so compiled steps are shared across stages."""

  schedule: LrSchedule
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  grad_clip: float = 1.0

  def build(self) -> optax.GradientTransformation:
    parts = []
    if self.grad_clip and self.grad_clip > 0:
      parts.append(optax.clip_by_global_norm(self.grad_clip))
    parts.append(optax.adamw(self.schedule.build(), b1=self.b1, b2=self.b2, eps=self.eps,
                             weight_decay=self.weight_decay, mask=decay_mask))
    return optax.chain(*parts)


def carry_moments(old_state, new_state, fn):
  """Moves Adam's moments from ``old_state`` into a freshly initialised ``new_state`` through ``fn`` (a C or D map).

  Adam's step count is carried too (its bias correction belongs to the moments); every other counter, the
  learning-rate schedule's included, keeps the fresh value, so the new stage's schedule starts from its beginning.
  """
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)
  old_adam = [x for x in jax.tree.leaves(old_state, is_leaf=is_adam) if is_adam(x)]
  it = iter(old_adam)

  def swap(x):
    if not is_adam(x):
      return x
    old = next(it)
    return optax.ScaleByAdamState(count=old.count, mu=fn(old.mu), nu=fn(old.nu))

  out = jax.tree.map(swap, new_state, is_leaf=is_adam)
  if next(it, None) is not None:
    raise ValueError("The old and new optimizer states hold different numbers of Adam states; cannot carry them.")
  return out
