"""BERT: a post-LN encoder with word + position + token-type embeddings and a tied masked-LM head."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from multilevel.models import axes as A
from multilevel.models.config import ModelConfig
from multilevel.models.family import Family, register
from multilevel.models.transformer import check_tokens, dense_init, layer_norm_axes, stack


class Bert(nn.Module):
  """``__call__(tokens_BxT, token_types_BxT=None, mask_BxT=None, train=False) -> logits_BxTxV`` (float32).

  ``part``: ``"embed"`` (tokens -> the stream entering the blocks), ``"head"`` (the stream leaving them -> logits; the
  first argument is then that stream), or ``"all"``."""

  cfg: ModelConfig
  part: str = "all"

  @nn.compact
  def __call__(self, x, token_types_BxT=None, mask_BxT=None, train: bool = False):
    cfg = self.cfg
    word = nn.Embed(cfg.vocab_size, cfg.width, embedding_init=dense_init(), name="word")
    if self.part != "head":
      tokens_BxT = x
      check_tokens(cfg, tokens_BxT)
      t = tokens_BxT.shape[1]
      pos = self.param("position", dense_init(), (cfg.max_len, cfg.width))
      types = self.param("token_type", dense_init(), (cfg.type_vocab_size, cfg.width))
      if token_types_BxT is None:
        token_types_BxT = jnp.zeros_like(tokens_BxT)
      x_BxTxD = word(tokens_BxT) + pos[None, :t] + jnp.take(types, token_types_BxT, axis=0)
      x_BxTxD = nn.LayerNorm(epsilon=cfg.eps, name="ln_embed")(x_BxTxD)
      x_BxTxD = nn.Dropout(cfg.dropout)(x_BxTxD, deterministic=not train)
      if self.part == "embed":
        return x_BxTxD
      x = stack(cfg, pre_ln=False, causal=False, deterministic=not train)(x_BxTxD, mask_BxT)
    x_BxTxD = x
    h_BxTxD = nn.Dense(cfg.width, kernel_init=dense_init(), name="mlm_dense")(x_BxTxD)
    h_BxTxD = nn.gelu(h_BxTxD, approximate=False)
    h_BxTxD = nn.LayerNorm(epsilon=cfg.eps, name="mlm_ln")(h_BxTxD)
    bias_V = self.param("mlm_bias", nn.initializers.zeros, (cfg.vocab_size,))
    return word.attend(h_BxTxD.astype(jnp.float32)) + bias_V[None, None, :]


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


def _head_flops(cfg: ModelConfig) -> float:
  t, d = cfg.max_len, cfg.width
  return 2 * t * d * d + 2 * t * d * cfg.vocab_size  # MLM transform + tied decoder at every position.


BERT = register(Family(
    "bert", Bert, BERT_AXES, modality="text", objective="mlm", pre_ln=False, tied_embedding=True, ln_eps=1e-12,
    positions=lambda cfg: cfg.max_len, head_flops=_head_flops,
    embedding_params=("word", "position", "token_type")))
