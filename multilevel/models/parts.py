"""A model run in pieces: the embedding, slices of the stacked blocks, the head.

Training methods that treat parts of a model differently use this: MSLT runs the frozen bottom layers forward only
(their output enters the trainable top layers under ``stop_gradient``, so no backward pass ever runs through them);
``apply_in_parts`` with every layer in one slice computes what ``models.apply`` computes.
"""

from __future__ import annotations

import jax

from multilevel.models.config import ModelConfig
from multilevel.models.family import family_of
from multilevel.models.transformer import Blocks


HEAD_OPTIONS = ("positions_BxP", "features")  # The head's own keywords (BERT's predicted positions, features).
_NOT_EMBED = ("mask_BxT",) + HEAD_OPTIONS  # Keywords the embedding does not take.


def outer(params) -> dict:
  """Every parameter but the stacked blocks (embeddings and head)."""
  return {k: v for k, v in params.items() if k != "layers"}


def embed(cfg: ModelConfig, outer_params, *inputs, train: bool = False, rngs=None, **kw):
  """The residual stream entering the blocks."""
  kw = {k: v for k, v in kw.items() if k not in _NOT_EMBED}
  return family_of(cfg).module(cfg, part="embed").apply({"params": outer_params}, *inputs, train=train, rngs=rngs,
                                                       **kw)


def blocks(cfg: ModelConfig, layers, x_BxTxD, mask_BxT=None, *, train: bool = False, rngs=None):
  """The blocks whose stacked parameters are ``layers`` (any number of them, leading axis first)."""
  n = jax.tree.leaves(layers)[0].shape[0]
  fam = family_of(cfg)
  sliced = cfg.replace(num_layers=n)
  module = fam.blocks(sliced, not train) if fam.blocks else Blocks(sliced, fam.pre_ln, fam.causal, not train)
  return module.apply({"params": {"layers": layers}}, x_BxTxD, mask_BxT, rngs=rngs)


def head(cfg: ModelConfig, outer_params, x_BxTxD, *, train: bool = False, rngs=None, **kw):
  """Logits from the stream leaving the blocks (``kw``: the head's own options, e.g. BERT's ``positions_BxP``,
  ``features``)."""
  return family_of(cfg).module(cfg, part="head").apply({"params": outer_params}, x_BxTxD, train=train, rngs=rngs,
                                                      **kw)


def apply_in_parts(cfg: ModelConfig, outer_params, slices, *inputs, frozen: int = 0, train: bool = False, rngs=None,
                   **kw):
  """Logits of the model whose blocks are the concatenation of ``slices`` (stacked layer trees, bottom first).

  With ``frozen = k > 0`` the embedding and the first k slices run forward only: their output enters slice k under
  ``stop_gradient``, so a gradient of the result never flows into them and XLA runs no backward pass through them.
  Which head parameters train is the caller's choice (``stop_gradient`` on those in ``outer_params`` that do not).
  """
  mask = kw.get("mask_BxT")
  x = embed(cfg, outer_params, *inputs, train=train, rngs=rngs, **kw)
  for i, layers in enumerate(slices):
    if i == frozen:
      x = jax.lax.stop_gradient(x) if frozen else x
    # Each slice draws its own dropout masks (the same key in two slices would repeat them layer for layer).
    slice_rngs = rngs if not rngs else {k: jax.random.fold_in(v, 1 + i) for k, v in rngs.items()}
    x = blocks(cfg, layers, x, mask, train=train, rngs=slice_rngs)
  if frozen >= len(slices):
    x = jax.lax.stop_gradient(x)
  head_kw = {k: v for k, v in kw.items() if k in HEAD_OPTIONS}
  return head(cfg, outer_params, x, train=train, rngs=rngs, **head_kw)
