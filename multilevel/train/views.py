"""How a training stage sees the model it trains: which parameters it holds, which of them train, how the loss runs.

Most stages train a whole model (``FULL``). Some methods train something else for a while: MSLT trains the top
layers of a model whose lower layers are frozen (``FrozenBottom``: forward only, no gradient, no optimizer state, no
weight decay for them); LiGO trains a growth operator while the small model it grows stays fixed; CoRe trains a
relaxed model. A view is a small frozen (hashable) dataclass carried by the stage (``Stage.view``) into the compiled
steps (``StepConfig.view``):

- ``abstract(cfg)`` / ``shardings(cfg, mesh)``: the tree the stage holds (its checkpoint's ``params``);
- ``split(vparams) -> (trainable, frozen)`` and ``merge(trainable, frozen)``: what the optimizer sees;
- ``apply(cfg, vparams, *inputs, **kw) -> logits``: the objectives' forward pass;
- ``from_model(cfg, params)`` / ``to_model(cfg, vparams)``: to and from the plain parameter tree of ``cfg``;
- ``train_flops_per_step(cfg, batch, objective)``: what a step computes, for the FLOPs accounting;
- ``uses_step``: ``apply`` takes the global step as the keyword ``step`` (MSG's masks ramp with it); the train step
  passes its global step and the evaluation the driver's current one. Views without it never see the step.

The train step differentiates only the trainable part, so the frozen part costs no backward pass where the view keeps
it out of the gradient's path (``FrozenBottom`` feeds the trainable layers through ``stop_gradient``).
"""

from __future__ import annotations

import dataclasses

import jax

from multilevel import models as M
from multilevel.models import parts
from multilevel.train.flops import forward_flops_per_example, train_flops_per_step
from multilevel.train.objectives import ObjectiveConfig
from multilevel.train.sharding import param_shardings


@dataclasses.dataclass(frozen=True)
class View:
  """The whole model, every parameter trained: what a stage trains unless its method says otherwise."""

  uses_step = False  # A class attribute, not a field: ``apply`` takes ``step=`` (the global step) when True.

  @property
  def name(self) -> str:
    return "full"

  def abstract(self, cfg):
    return M.abstract_params(cfg)

  def shardings(self, cfg, mesh):
    return param_shardings(cfg, mesh)

  def from_model(self, cfg, params):
    return params

  def to_model(self, cfg, vparams):
    return vparams

  def split(self, vparams):
    return vparams, None

  def merge(self, trainable, frozen):
    return trainable

  def apply(self, cfg, vparams, *inputs, **kw):
    return M.apply(cfg, vparams, *inputs, **kw)

  def vocab_layer(self, cfg, vparams):
    """Text families: the vocabulary layer ``(embedding_VxD, bias_V or None)`` that ``apply(..., features=True)``
    feeds (the losses apply it themselves); by default the family's, read off ``to_model``."""
    return M.family_of(cfg).output_embedding(self.to_model(cfg, vparams))

  def train_flops_per_step(self, cfg, global_batch: int, objective=None) -> float:
    return train_flops_per_step(cfg, global_batch, objective)


FULL = View()


def _slice_layers(layers, lo: int, hi: int):
  """Layers ``lo:hi`` of a stacked layer tree (of arrays, of abstract arrays, or of shardings, kept as they are)."""
  def cut(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct((hi - lo,) + tuple(x.shape[1:]), x.dtype, sharding=x.sharding)
    return x[lo:hi] if hasattr(x, "shape") else x
  return jax.tree.map(cut, layers)


def _concat_layers(a, b):
  import jax.numpy as jnp
  return jax.tree.map(lambda x, y: jnp.concatenate([x, y], axis=0), a, b)


def head_only_names(cfg) -> tuple[str, ...]:
  """Top-level parameters the head uses and the embedding does not (e.g. GPT's final LayerNorm, BERT's MLM
  transform and output bias, DeiT's classifier): what trains beside the top layers when the bottom is frozen. A
  tied word embedding is used by both, so it stays with the frozen embedding."""
  fam = M.family_of(cfg)
  emb = jax.eval_shape(lambda: fam.module(cfg, part="embed").init(jax.random.key(0), *M.dummy_inputs(cfg)))
  names = set(M.abstract_params(cfg)) - {"layers"} - set(emb["params"])
  return tuple(sorted(names))


@dataclasses.dataclass(frozen=True)
class FrozenBottom(View):
  """The first ``frozen_layers`` blocks and the embedding frozen (forward only); the blocks above them and the
  head's own parameters train. The stage holds ``{'frozen': {...}, 'train': {...}}``, each with its share of the
  top-level parameters and a ``layers`` slice."""

  frozen_layers: int

  @property
  def name(self) -> str:
    return f"frozen_bottom({self.frozen_layers})"

  def _restructure(self, cfg, tree):
    head = head_only_names(cfg)
    k = self.frozen_layers
    frozen = {n: v for n, v in tree.items() if n != "layers" and n not in head}
    train = {n: tree[n] for n in head}
    frozen["layers"] = _slice_layers(tree["layers"], 0, k)
    train["layers"] = _slice_layers(tree["layers"], k, cfg.num_layers)
    return {"frozen": frozen, "train": train}

  def abstract(self, cfg):
    return self._restructure(cfg, M.abstract_params(cfg))

  def shardings(self, cfg, mesh):
    return self._restructure(cfg, param_shardings(cfg, mesh))

  def from_model(self, cfg, params):
    if not 0 < self.frozen_layers < cfg.num_layers:
      raise ValueError(f"FrozenBottom({self.frozen_layers}) needs between 1 and {cfg.num_layers - 1} frozen layers "
                       f"for a {cfg.num_layers}-layer model.")
    return self._restructure(cfg, params)

  def to_model(self, cfg, vparams):
    f, t = vparams["frozen"], vparams["train"]
    out = {n: v for part in (f, t) for n, v in part.items() if n != "layers"}
    out["layers"] = _concat_layers(f["layers"], t["layers"])
    return out

  def split(self, vparams):
    return vparams["train"], vparams["frozen"]

  def merge(self, trainable, frozen):
    return {"frozen": frozen, "train": trainable}

  def apply(self, cfg, vparams, *inputs, **kw):
    f, t = vparams["frozen"], vparams["train"]
    outer = {n: v for part in (f, t) for n, v in part.items() if n != "layers"}
    return parts.apply_in_parts(cfg, outer, [f["layers"], t["layers"]], *inputs, frozen=1, **kw)

  def train_flops_per_step(self, cfg, global_batch: int, objective=None) -> float:
    """Forward through everything; backward (twice the forward) through the trained layers and the head only."""
    fam, n = M.family_of(cfg), cfg.num_layers
    forward = forward_flops_per_example(cfg, objective)
    head = fam.head_flops(cfg, objective or ObjectiveConfig())
    per_layer = (forward - head) / n
    trained = (n - self.frozen_layers) * per_layer + head - fam.embed_flops(cfg)
    return float((forward + 2.0 * trained) * global_batch)
