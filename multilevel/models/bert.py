"""BERT: a post-LN encoder with word + position + token-type embeddings and a tied masked-LM head."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from multilevel.models import axes as A
from multilevel.models.config import ModelConfig
from multilevel.models.family import Family, register
from multilevel.models.transformer import (check_token_types, check_tokens, compute_dtype, dense_init, layer_norm_axes,
                                           over_rows, stack, vocab_logits)


class Bert(nn.Module):
  """``__call__(tokens_BxT, token_types_BxT=None, mask_BxT=None, train=False) -> logits_BxTxV`` (float32).

  ``part``: ``"embed"`` (tokens -> the stream entering the blocks), ``"head"`` (the stream leaving them -> logits; the
  first argument is then that stream), or ``"all"``.
  ``positions_BxP`` (int, per row) runs the masked-LM head only at those positions (gathered first, in ``"head"`` as in
  ``"all"``): ``logits_BxPxV``. ``features=True`` returns what the tied decoder reads instead of logits (the head's
  transform, ``h_BxTxD`` or ``h_BxPxD``), for losses that apply the decoder themselves (``multilevel.train.losses``)."""

  cfg: ModelConfig
  part: str = "all"

  @nn.compact
  def __call__(self, x, token_types_BxT=None, mask_BxT=None, train: bool = False, positions_BxP=None,
               features: bool = False):
    cfg = self.cfg
    word = nn.Embed(cfg.vocab_size, cfg.width, embedding_init=dense_init(), name="word")
    if self.part != "head":
      ids_BxT = check_tokens(cfg, x)
      t = ids_BxT.shape[1]
      pos = self.param("position", dense_init(), (cfg.max_len, cfg.width))
      types = self.param("token_type", dense_init(), (cfg.type_vocab_size, cfg.width))
      if token_types_BxT is None:
        token_types_BxT = jnp.zeros_like(ids_BxT)
      type_ids_BxT = check_token_types(cfg, token_types_BxT, ids_BxT)
      x_BxTxD = word(ids_BxT) + pos[None, :t] + jnp.take(types, type_ids_BxT, axis=0)
      x_BxTxD = nn.LayerNorm(epsilon=cfg.eps, name="ln_embed")(x_BxTxD)
      x_BxTxD = nn.Dropout(cfg.dropout)(x_BxTxD, deterministic=not train)
      if self.part == "embed":
        return x_BxTxD
      x = stack(cfg, pre_ln=False, causal=False, deterministic=not train)(x_BxTxD, mask_BxT)
    x_BxTxD = x
    if positions_BxP is not None:  # Only the predicted positions go through the head (15% of them in training).
      x_BxTxD = jnp.take_along_axis(x_BxTxD, positions_BxP[:, :, None], axis=1)
    h_BxTxD = over_rows(nn.Dense(cfg.width, kernel_init=dense_init(), name="mlm_dense"), x_BxTxD)
    h_BxTxD = nn.gelu(h_BxTxD, approximate=False)
    h_BxTxD = nn.LayerNorm(epsilon=cfg.eps, name="mlm_ln")(h_BxTxD)
    bias_V = self.param("mlm_bias", nn.initializers.zeros, (cfg.vocab_size,))
    if features:
      return h_BxTxD.astype(jnp.float32)
    return vocab_logits(h_BxTxD, word.embedding, bias_V, compute_dtype(cfg))


BERT_AXES = A.with_blocks({
    "word/embedding": (None, A.EMBED),
    "position": (None, A.EMBED),
    "token_type": (None, A.EMBED),
    **layer_norm_axes("ln_embed"),
    "mlm_dense/kernel": (A.HIDDEN_IN, A.HIDDEN_OUT),
    "mlm_dense/bias": (A.HIDDEN_OUT,),
    **layer_norm_axes("mlm_ln"),
    "mlm_bias": (None,),  # Vocabulary bias: copied unchanged.
})


def mlm_predictions(length: int, mlm_prob: float) -> int:
  """Positions predicted per row of ``length`` tokens: ``round(mlm_prob * length)``, at least one while
  ``mlm_prob > 0`` (the original BERT data pipeline's rule, with ``max_predictions_per_seq`` = this count)."""
  return min(length, max(1, round(mlm_prob * length))) if mlm_prob > 0 else 0


def _head_flops(cfg: ModelConfig, objective) -> float:
  p, d = mlm_predictions(cfg.max_len, objective.mlm_prob), cfg.width
  return 2 * p * d * d + 2 * p * d * cfg.vocab_size  # MLM transform + tied decoder at the predicted positions only.


BERT = register(Family(
    "bert", Bert, BERT_AXES, modality="text", objective="mlm", pre_ln=False, tied_embedding=True, ln_eps=1e-12,
    positions=lambda cfg: cfg.max_len, head_flops=_head_flops,
    embedding_params=("word", "position", "token_type"),
    output_embedding=lambda params: (params["word"]["embedding"], params["mlm_bias"])))
