"""AdamW with warm-up and decay from optax, gradient clipping, and the decay mask of BERT/GPT practice."""

from __future__ import annotations

import dataclasses

import jax
import optax

from multilevel.tree import flatten, unflatten

DECAYS = ("linear", "cosine", "constant", "wsd")


@dataclasses.dataclass(frozen=True)
class LrSchedule:
  """Peak learning rate, linear warm-up steps, then decay over the rest of ``steps`` (to ``end_frac * peak``).

  ``decay='wsd'`` (warm-up, stable, decay) holds the peak after the warm-up and decays linearly to ``end_frac *
  peak`` over the last ``cooldown`` steps only; the other decays take no ``cooldown``."""

  peak: float
  steps: int
  warmup: int = 0
  decay: str = "linear"
  end_frac: float = 0.0
  cooldown: int = 0

  def __post_init__(self):
    if self.decay not in DECAYS:
      raise ValueError(f"Learning-rate decay must be one of {DECAYS}, got {self.decay!r}.")
    if self.steps < 1 or not 0 <= self.warmup <= self.steps:
      raise ValueError(f"Bad schedule: {self.steps} steps with {self.warmup} warm-up steps.")
    if not self.peak > 0:
      raise ValueError(f"The peak learning rate must be positive, got {self.peak}.")
    if self.decay == "wsd" and not 1 <= self.cooldown <= self.steps - self.warmup:
      raise ValueError(f"A warm-up-stable-decay schedule of {self.steps} steps with {self.warmup} warm-up steps "
                       f"needs 1 to {self.steps - self.warmup} cool-down steps, got {self.cooldown}; raise "
                       f"train.cooldown_frac or the stage's steps.")
    if self.decay != "wsd" and self.cooldown:
      raise ValueError(f"cooldown={self.cooldown} is read only by decay='wsd', not {self.decay!r}.")

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
    elif self.decay == "wsd":
      if rest > self.cooldown:
        parts.append(optax.constant_schedule(self.peak))
        bounds.append(self.warmup + rest - self.cooldown)
      parts.append(optax.linear_schedule(self.peak, end, self.cooldown))
    else:
      parts.append(optax.cosine_decay_schedule(self.peak, rest, alpha=self.end_frac))
    return optax.join_schedules(parts, bounds) if bounds else parts[0]


def schedule_for(train, peak: float, steps: int, warmup: int) -> LrSchedule:
  """A stage's schedule from the ``train`` section's decay: for ``'wsd'``, the cool-down is ``train.cooldown_frac``
  of the stage's steps (at least one, at most what the warm-up leaves)."""
  if train.decay != "wsd":
    return LrSchedule(peak, steps, warmup, train.decay)
  cooldown = min(max(1, round(float(train.cooldown_frac) * steps)), steps - warmup)
  if cooldown < 1:
    raise ValueError(f"A stage of {steps} steps with a {warmup}-step warm-up leaves no step for the WSD cool-down; "
                     f"lower train.warmup_frac or lengthen the stage.")
  return LrSchedule(peak, steps, warmup, "wsd", cooldown=cooldown)


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
  # Per-parameter learning-rate multipliers, ('/'-joined path, factor) pairs; parameters not named keep 1.
  lr_multipliers: tuple[tuple[str, float], ...] = ()

  def build(self) -> optax.GradientTransformation:
    parts = []
    if self.grad_clip and self.grad_clip > 0:
      parts.append(optax.clip_by_global_norm(self.grad_clip))
    parts.append(optax.adamw(self.schedule.build(), b1=self.b1, b2=self.b2, eps=self.eps,
                             weight_decay=self.weight_decay, mask=decay_mask))
    if self.lr_multipliers:
      parts.append(scale_leaves(dict(self.lr_multipliers)))
    return optax.chain(*parts)


def scale_leaves(factors: dict[str, float]) -> optax.GradientTransformation:
  """Multiplies the update of each parameter named in ``factors`` ('/'-joined path) by its factor: a per-parameter
  learning rate (it scales AdamW's decoupled weight decay with it, as a learning rate does)."""

  def update(updates, state, params=None):
    del params
    flat = flatten(updates)
    return unflatten({k: v * factors[k] if k in factors else v for k, v in flat.items()}), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


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
