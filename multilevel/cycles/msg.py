"""MSG, masked structural growth (Yao et al., ICLR 2024, ``cofe-ai/MSG``) as a method.

A small model trains; at each growth event one dimension grows to the target's size: the old weights are copied
into the top-left block of the larger tensors, new entries drawn N(0, 0.02) (biases 0, LayerNorm scale 1), and the
new units enter behind a mask c that ramps linearly from 0 at the event step to 1 at ``ramp`` steps later. At c = 0
the grown model computes exactly what the old one did whatever the new weights are (up to float rounding of the
masked LayerNorm statistics: ``tests/test_msg.py`` measures it); after the ramp the masks are dropped and the model
trains as a plain one. Adam's moments of the old coordinates are kept, the new ones start at zero, and Adam's step
count is kept (the code's ``transfer_states``).

Growth kinds (``cycle.msg.order``, each at most once; the script's order FFN -> layers -> heads by default):

- ``ffn``: ``ffn_ratio`` grows by ``ffn_factor``; the FFN's pre-activation of the new units is multiplied by c
  (GELU(0) = 0, so new units add nothing at c = 0).
- ``layers``: ``num_layers`` grows by ``depth_factor``; the new blocks go on top, as copies of blocks ``j mod L``
  of the old model (the code's default copy-stack; ``new_layers='random'`` draws them fresh), and each computes
  ``h_out = c Block(h) + (1 - c) h`` (the identity at c = 0, post-LN BERT included).
- ``heads``: ``num_heads`` grows by ``heads_factor`` with the head size fixed. In this engine the hidden size is
  ``num_heads x head_dim`` and the FFN ``ffn_ratio x hidden``, so a heads event is MSG's heads, hidden and FFN
  growth at once, under one ramp: the Q/K/V outputs of new heads, the FFN pre-activation of new units and the new
  hidden coordinates (after the embedding, after every LayerNorm, and on the attention and FFN output projections)
  are multiplied by c, and every LayerNorm computes its statistics over the coordinates weighted by the mask (the
  code's ``LayerNormEx``: over the old coordinates alone at c = 0, ordinary LayerNorm at c = 1). Growing the
  hidden size alone (more hidden units, the same heads) is not done: the model config cannot express it.

The masks are a view of the grown model (``MsgView``): the stage holds the plain parameter tree, and its forward
intercepts the shared transformer's modules (``flax.linen.intercept_methods``) to multiply by the masks, so the
models' own code, and what a plain stage computes, are untouched. The view takes the global step (``uses_step``).

Schedule (the paper's Table 2 is not public; ours, documented in the README): the start model is the target
divided by the factors of the kinds in ``order``; events at ``event_fracs`` of ``train.steps`` (default: evenly
over the first ``growth_span`` = 40%); each ramp lasts ``ramp_steps`` (or ``ramp_frac`` of the budget); one
learning-rate curve (scratch's warm-up and linear decay) runs across all stages. The code's LR rewinds at the first
two events are the option ``lr_schedule='rewind'``; its option to reset Adam's step for new entries is not
implemented. FLOPs count the grown model
from the event step on (the masks' multiplications are not counted).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from multilevel import models as M
from multilevel.cycles.plan import Method, Plan, Stage, Transition, optim_for, register_method, scratch_schedules
from multilevel.models import ModelConfig, parts
from multilevel.models.transformer import Attention, Mlp
from multilevel.train.optim import LrSchedule, carry_moments
from multilevel.train.views import FULL, View
from multilevel.tree import flatten, unflatten
from multilevel.typed_config import ConfigError, check_fields

KINDS = ("ffn", "layers", "heads")
NEW_LAYERS = ("copy", "random")
LR_SCHEDULES = ("continuous", "rewind")


@dataclasses.dataclass(frozen=True)
class MsgConfig:
  """``cycle.msg``: MSG's options. The factors of kinds left out of ``order`` are not used."""

  order: tuple[str, ...] = ("ffn", "layers", "heads")  # Growth events in order, each kind at most once.
  ffn_factor: int = 2  # The start model has ffn_ratio / ffn_factor ...
  depth_factor: int = 2  # ... num_layers / depth_factor layers ...
  heads_factor: int = 2  # ... and num_heads / heads_factor heads (hidden size alike: head_dim is kept).
  event_fracs: tuple[float, ...] = ()  # Step of each event as a share of train.steps; () = evenly over growth_span.
  growth_span: float = 0.4  # With event_fracs=(): the events at growth_span * (i + 1) / n of the budget.
  ramp_frac: float = 0.05  # Mask ramp length as a share of train.steps ...
  ramp_steps: int = 0  # ... or in steps (> 0 overrides ramp_frac). The code's grow_time.
  new_layers: str = "copy"  # copy (new block j copies old block j mod L, the code's default) | random
  init_std: float = 0.02  # Std of new weight entries.
  lr_schedule: str = "continuous"  # continuous (scratch's curve) | rewind (back to the peak at the first 2 events)

  def __post_init__(self):
    check_fields(self, "cycle.msg")
    for k in self.order:
      if k == "hidden":
        raise ConfigError("cycle.msg.order: 'hidden' alone is not supported: here the hidden size is num_heads x "
                          "head_dim, so grow it with 'heads' (which grows heads, hidden and FFN width together "
                          "under the masks).")
      if k not in KINDS:
        raise ConfigError(f"cycle.msg.order: unknown growth kind {k!r}; choose from {KINDS}.")
    if not self.order or len(set(self.order)) != len(self.order):
      raise ConfigError(f"cycle.msg.order must name each growth kind at most once (and at least one), got "
                        f"{list(self.order)}; each grows its dimension from the start size to the target's.")
    for k in self.order:
      if getattr(self, _FACTOR[k]) < 2:
        raise ConfigError(f"cycle.msg.{_FACTOR[k]} must be >= 2 for a {k!r} event (the growth multiple), got "
                          f"{getattr(self, _FACTOR[k])}; or drop {k!r} from cycle.msg.order.")
    if self.event_fracs and len(self.event_fracs) != len(self.order):
      raise ConfigError(f"cycle.msg.event_fracs needs one share per event of cycle.msg.order ({len(self.order)}), "
                        f"got {list(self.event_fracs)}; or () for the default spacing.")
    if any(not 0 < f < 1 for f in self.event_fracs) or list(self.event_fracs) != sorted(self.event_fracs):
      raise ConfigError(f"cycle.msg.event_fracs must be increasing shares in (0, 1), got {list(self.event_fracs)}.")
    if not 0 < self.growth_span < 1:
      raise ConfigError(f"cycle.msg.growth_span must be in (0, 1), got {self.growth_span}.")
    if not 0 < self.ramp_frac < 1 or self.ramp_steps < 0:
      raise ConfigError(f"cycle.msg.ramp_frac must be in (0, 1) and ramp_steps >= 0, got {self.ramp_frac} and "
                        f"{self.ramp_steps}.")
    if self.new_layers not in NEW_LAYERS:
      raise ConfigError(f"cycle.msg.new_layers must be one of {NEW_LAYERS}, got {self.new_layers!r}.")
    if self.lr_schedule not in LR_SCHEDULES:
      raise ConfigError(f"cycle.msg.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}.")
    if not self.init_std >= 0:
      raise ConfigError(f"cycle.msg.init_std must be >= 0, got {self.init_std}.")


_FACTOR = {"ffn": "ffn_factor", "layers": "depth_factor", "heads": "heads_factor"}
_FIELD = {"ffn": "ffn_ratio", "layers": "num_layers", "heads": "num_heads"}


# ---------------------------------------------------------------------------------------------- growth

def _top_left(fill, old):
  """``fill`` with ``old`` written into its leading corner (every axis of ``old`` no longer than ``fill``'s)."""
  return fill.at[tuple(slice(0, n) for n in old.shape)].set(old.astype(fill.dtype))


def grow_params(old_params, old: ModelConfig, new: ModelConfig, key, new_layers: str = "copy",
                std: float = 0.02) -> dict:
  """The grown parameters of ``new``: the old tensors in the top-left block, new entries N(0, std) (biases 0,
  LayerNorm scales 1); with ``new_layers='copy'`` new block j is a copy of old block ``j mod old.num_layers``."""
  flat_old, out = flatten(old_params), {}
  for i, (name, a) in enumerate(sorted(flatten(M.abstract_params(new)).items())):
    o = flat_old[name]
    leaf = name.rsplit("/", 1)[-1]
    if leaf == "scale":
      fill = jnp.ones(a.shape, a.dtype)
    elif leaf == "bias" or leaf.endswith("_bias"):
      fill = jnp.zeros(a.shape, a.dtype)
    else:
      fill = std * jax.random.normal(jax.random.fold_in(key, i), a.shape, a.dtype)
    if name.startswith("layers/") and new_layers == "copy" and new.num_layers > old.num_layers:
      o = o[jnp.arange(new.num_layers) % old.num_layers]
    out[name] = _top_left(fill, o)
  return unflatten(out)


def pad_moments(tree, new: ModelConfig):
  """Adam moments of the old model zero-padded to the shapes of ``new`` (the old coordinates keep theirs)."""
  return jax.tree.map(lambda o, a: _top_left(jnp.zeros(a.shape, o.dtype), o), tree, M.abstract_params(new))


# ---------------------------------------------------------------------------------------------- the masks

def unit_mask(n_old: int, n_new: int, c):
  """Ones on the ``n_old`` old units, ``c`` on the ``n_new - n_old`` new ones (float32)."""
  c = jnp.asarray(c, jnp.float32)
  return jnp.concatenate([jnp.ones((n_old,), jnp.float32), jnp.broadcast_to(c, (n_new - n_old,))])


def _times(y, m, axis: int):
  """``y`` times the mask ``m`` along ``axis`` (explicit broadcasting)."""
  shape = [1] * y.ndim
  shape[axis] = m.shape[0]
  return y * m.reshape(shape).astype(y.dtype)


def masked_layer_norm(module: nn.LayerNorm, x, m):
  """LayerNorm whose statistics weight each coordinate by ``m`` (the code's ``LayerNormEx``), then times ``m``;
  the same formulas as Flax's LayerNorm (E[x^2] - E[x]^2), so that at m = 1 it is ordinary LayerNorm."""
  scale = module.get_variable("params", "scale")
  bias = module.get_variable("params", "bias")
  x32 = x.astype(jnp.float32)
  w = m.reshape((1,) * (x.ndim - 1) + (-1,))
  n = jnp.sum(m)
  mean = jnp.sum(x32 * w, axis=-1, keepdims=True) / n
  mean2 = jnp.sum(jnp.square(x32) * w, axis=-1, keepdims=True) / n
  var = jnp.maximum(0.0, mean2 - jnp.square(mean))
  y = (x32 - mean) * (jax.lax.rsqrt(var + module.epsilon) * scale.reshape(w.shape)) + bias.reshape(w.shape)
  return (y * w).astype(module.dtype or jnp.float32)


def _width_interceptor(cfg: ModelConfig, old: ModelConfig, c):
  """A Flax method interceptor that multiplies the new units of ``cfg`` (over ``old``) by ``c`` at MSG's sites."""
  fam = M.family_of(cfg)
  m_d = unit_mask(old.width, cfg.width, c) if cfg.width != old.width else None
  m_h = unit_mask(old.num_heads, cfg.num_heads, c) if cfg.num_heads != old.num_heads else None
  m_f = unit_mask(old.ffn_dim, cfg.ffn_dim, c) if cfg.ffn_dim != old.ffn_dim else None

  def intercept(next_fun, args, kwargs, context):
    mod = context.module
    if context.method_name != "__call__":
      return next_fun(*args, **kwargs)
    if m_d is not None and isinstance(mod, nn.LayerNorm):
      return masked_layer_norm(mod, args[0], m_d)
    y = next_fun(*args, **kwargs)
    parent = mod.parent
    if m_f is not None and isinstance(parent, Mlp) and mod.name == "fc1":
      return _times(y, m_f, -1)  # The pre-activation: new units give GELU(0) = 0.
    if m_h is not None and isinstance(parent, Attention) and mod.name in ("query", "key", "value"):
      return _times(y, m_h, -2)  # (batch, time, heads, head_dim): the heads axis.
    if m_d is not None:
      writes = (isinstance(parent, Attention) and mod.name == "out") or (isinstance(parent, Mlp) and mod.name == "fc2")
      # The embedding's output: its dropout at the family's top level (pre-LN; BERT's embedding LayerNorm is masked).
      embeds = fam.pre_ln and isinstance(mod, nn.Dropout) and isinstance(parent, fam.module)
      if writes or embeds:
        return _times(y, m_d, -1)
    return y

  return intercept


def _layer_ramp_apply(cfg, old: ModelConfig, params, c, *inputs, train=False, rngs=None, **kw):
  """The model with blocks ``old.num_layers:`` new, each ``h = c Block(h) + (1 - c) h`` (the parts of
  ``models.parts``; each block slice draws its own dropout keys as ``apply_in_parts`` does)."""
  mask = kw.get("mask_BxT")
  outer = parts.outer(params)
  fold = lambda i: rngs if not rngs else {k: jax.random.fold_in(v, 1 + i) for k, v in rngs.items()}
  cut = lambda lo, hi: jax.tree.map(lambda x: x[lo:hi], params["layers"])
  x = parts.embed(cfg, outer, *inputs, train=train, rngs=rngs, **kw)
  n = old.num_layers
  x = parts.blocks(cfg, cut(0, n), x, mask, train=train, rngs=fold(0))
  c = jnp.asarray(c, jnp.float32)
  for j in range(n, cfg.num_layers):
    y = parts.blocks(cfg, cut(j, j + 1), x, mask, train=train, rngs=fold(1 + j - n))
    x = c * y + (1.0 - c) * x
  head_kw = {k: v for k, v in kw.items() if k in parts.HEAD_OPTIONS}  # The losses' features, BERT's positions.
  return parts.head(cfg, outer, x, train=train, rngs=rngs, **head_kw)


@dataclasses.dataclass(frozen=True)
class MsgView(View):
  """A grown model while its new units ramp in: ``kind`` grew from ``old`` at global step ``start``; the mask is
  ``c(step) = clip((step - start) / ramp, 0, 1)``. Holds and trains the whole (grown) model."""

  kind: str
  old: ModelConfig
  start: int
  ramp: int
  uses_step = True

  @property
  def name(self) -> str:
    return f"msg_{self.kind}"

  def mask_value(self, step):
    return jnp.clip((jnp.asarray(step, jnp.float32) - self.start) / self.ramp, 0.0, 1.0)

  def apply(self, cfg, vparams, *inputs, step=None, **kw):
    if step is None:
      raise ValueError("MsgView.apply needs the global step (step=...): the masks ramp with it.")
    c = self.mask_value(step)
    if self.kind == "layers":
      return _layer_ramp_apply(cfg, self.old, vparams, c, *inputs, **kw)
    with nn.intercept_methods(_width_interceptor(cfg, self.old, c)):
      return M.apply(cfg, vparams, *inputs, **kw)


# ---------------------------------------------------------------------------------------------- the method

def event_steps(opts: MsgConfig, total: int) -> tuple[int, ...]:
  n = len(opts.order)
  fracs = opts.event_fracs or tuple(opts.growth_span * (i + 1) / n for i in range(n))
  return tuple(round(float(f) * total) for f in fracs)


def ramp_length(opts: MsgConfig, total: int) -> int:
  return opts.ramp_steps if opts.ramp_steps > 0 else max(1, round(opts.ramp_frac * total))


def check_model(model: ModelConfig, opts: MsgConfig) -> None:
  """Refuses an event that would not grow ``model`` behind its masks: a ``heads`` event on a family with its own
  blocks (the masks reach the shared core's attention, FFN and LayerNorm only), an ``ffn`` event where the FFN width
  is ``ffn_size`` (``ffn_ratio`` would change nothing). A ``layers`` event mixes whole blocks and works for every
  family."""
  fam = M.family_of(model)
  if "heads" in opts.order and fam.blocks is not None:
    raise ConfigError(f"cycle.msg.order has a 'heads' event, whose masks act on the shared transformer's attention, "
                      f"FFN and LayerNorm; family {model.family!r} has its own blocks, which they do not reach, so "
                      f"the grown model would not compute the small one's function at mask 0. Use "
                      f"cycle.msg.order=('layers',) (exact for every family), or cycle.method='vcycle'.")
  if "ffn" in opts.order and model.ffn_size:
    raise ConfigError(f"cycle.msg.order has an 'ffn' event, which grows model.ffn_ratio, but this model's FFN width is "
                      f"model.ffn_size={model.ffn_size}, which ffn_ratio does not change: the event would grow "
                      f"nothing. Drop 'ffn' from cycle.msg.order.")


def model_sizes(model: ModelConfig, opts: MsgConfig) -> tuple[ModelConfig, ...]:
  """The start model and the model after each event (the last is ``model``)."""
  check_model(model, opts)
  small = {}
  for k in opts.order:
    f, have = getattr(opts, _FACTOR[k]), getattr(model, _FIELD[k])
    if have % f:
      raise ConfigError(f"cycle.msg.{_FACTOR[k]}={f} must divide the target's {_FIELD[k]}={have} (the start model "
                        f"has {_FIELD[k]} / {_FACTOR[k]}); choose a divisor of {have}.")
    small[_FIELD[k]] = have // f
  sizes = [model.replace(**small)]
  for k in opts.order:
    sizes.append(sizes[-1].replace(**{_FIELD[k]: getattr(model, _FIELD[k])}))
  return tuple(sizes)


def rewind_schedules(train, steps: tuple[int, ...], rewinds: tuple[int, ...]) -> tuple[LrSchedule, ...]:
  """The code's ``get_scheduler_ex``: scratch's linear warm-up and decay, except that at each step of ``rewinds``
  the curve jumps back to its peak and decays from there with the same slope (so it ends above zero); cut into
  stages of ``steps`` steps (a rewind falls on a stage boundary)."""
  total, lr = sum(steps), float(train.lr)
  warm = round(train.warmup_frac * total)
  if train.decay != "linear":
    raise ValueError(f"lr_schedule='rewind' rewinds a linear decay; train.decay={train.decay!r} is not. Use "
                     f"train.decay='linear' or cycle.msg.lr_schedule='continuous'.")
  if warm > steps[0]:
    raise ValueError(f"The warm-up ({warm} steps, train.warmup_frac={train.warmup_frac}) is longer than the first "
                     f"stage ({steps[0]} steps); lower train.warmup_frac or move the first event later.")
  curve = lambda t: lr * (t / warm if t < warm else (total - t) / max(total - warm, 1))
  out, start = [], 0
  for i, n in enumerate(steps):
    r = max((e for e in rewinds if e <= start), default=None)
    at = (lambda t: curve(t)) if r is None else (lambda t, r=r: curve(t - r + warm))
    if i == 0:
      out.append(LrSchedule(lr, n, warm, "linear", at(start + n) / lr))
    else:
      out.append(LrSchedule(at(start), n, 0, "linear", at(start + n) / at(start)))
    start += n
  return tuple(out)


def msg_plan(model, cycle, train) -> Plan:
  opts: MsgConfig = cycle.msg
  sizes, total = model_sizes(model, opts), train.steps
  events, ramp = event_steps(opts, total), ramp_length(opts, total)
  ramp_src = f"cycle.msg.ramp_steps={opts.ramp_steps}" if opts.ramp_steps else f"cycle.msg.ramp_frac={opts.ramp_frac}"
  if events[0] < 1:
    raise ConfigError(f"The first growth event falls at step {events[0]}: the start model needs at least one step; "
                      f"raise cycle.msg.event_fracs[0] (or growth_span) or train.steps.")
  ends = events[1:] + (total,)
  for i, (e, end) in enumerate(zip(events, ends)):
    what = f"the next event ({opts.order[i + 1]!r} at step {end})" if i + 1 < len(events) else f"train.steps={end}"
    if end - e <= ramp:
      raise ConfigError(f"The {opts.order[i]!r} event at step {e} ramps its masks over {ramp} steps ({ramp_src}), "
                        f"which does not end before {what}: a ramp must end inside its stage and growths may not "
                        f"overlap. Shorten the ramp (cycle.msg.ramp_steps / ramp_frac) or space the events "
                        f"(cycle.msg.event_fracs).")
  n = len(opts.order)
  steps = [events[0]]
  for e, end in zip(events, ends):
    steps += [ramp, end - e - ramp]
  try:
    schedules = (scratch_schedules(train, tuple(steps)) if opts.lr_schedule == "continuous" else
                 rewind_schedules(train, tuple(steps), events[:2]))
  except ValueError as e:
    raise ConfigError(f"cycle.method='msg' runs one learning-rate curve across its stages: {e}") from None
  levels = tuple(reversed(sizes))  # levels[0] is the target; the model after event i is level n - i.
  stages = [Stage(0, n, "small", "init", steps[0], optim_for(schedules[0], train))]
  for i, k in enumerate(opts.order):
    view = MsgView(k, sizes[i], events[i], ramp)
    j = 1 + 2 * i
    stages.append(Stage(j, n - 1 - i, f"ramp_{k}", "grow", steps[j], optim_for(schedules[j], train), view=view))
    stages.append(Stage(j + 1, n - 1 - i, "grown", "end_grow", steps[j + 1], optim_for(schedules[j + 1], train)))
  return Plan("msg", levels, tuple(stages), opts, (), train.seed)


def msg_transition(plan: Plan, src: Stage, dst: Stage) -> Transition:
  """Into a ramp stage: the grown parameters and Adam's moments zero-padded (step count kept); out of it: the masks
  dropped, the state kept. Each new stage's learning-rate schedule starts at its own beginning."""
  opts: MsgConfig = plan.options
  cfg = plan.levels[dst.level]
  if dst.enter == "grow" and isinstance(dst.view, MsgView):
    old = plan.levels[src.level]
    key = jax.random.fold_in(jax.random.key(plan.seed + 1_212), dst.index)
    grow = lambda c: {"params": grow_params(c["params"], old, cfg, key, opts.new_layers, opts.init_std)}

    def optimizer(c):
      fresh = dst.optim.build().init(c["params"])
      return {"opt_state": carry_moments(c["opt_state"], fresh, lambda t: pad_moments(t, cfg))}

    return Transition("grow", (("grow", grow), ("optimizer", optimizer)), f"after_grow_{dst.view.kind}")
  if dst.enter == "end_grow" and dst.view is FULL and dst.level == src.level:
    keep = lambda c: {"opt_state": carry_moments(c["opt_state"], dst.optim.build().init(c["params"]), lambda t: t)}
    return Transition("end_grow", (("optimizer", keep),), "after_end_grow")
  raise ValueError(f"Stage {dst.name} cannot be entered by {dst.enter!r} from {src.name}.")


MSG = register_method(Method("msg", msg_plan, msg_transition,
                             "MSG: grow FFN, layers and heads behind masks that ramp 0 -> 1; Adam moments kept."))
