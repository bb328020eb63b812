"""GPT-2: a pre-LN causal decoder with learned positions, a final LayerNorm and an LM head tied to the embeddings."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from multilevel.models import axes as A
from multilevel.models.config import ModelConfig
from multilevel.models.family import Family, register
from multilevel.models.transformer import check_tokens, compute_dtype, dense_init, layer_norm_axes, stack, vocab_logits


class Gpt(nn.Module):
  """``__call__(tokens_BxT, train=False) -> logits_BxTxV`` (float32).

  ``part`` runs a piece of the model: ``"embed"`` (tokens -> the residual stream entering the blocks) or ``"head"``
  (the stream leaving the blocks -> logits); ``"all"`` is the whole model (``models.parts`` composes them).
  ``features=True`` returns the final LayerNorm's output ``h_BxTxD`` that the tied LM head reads, for losses that
  apply the head themselves."""

  cfg: ModelConfig
  part: str = "all"

  @nn.compact
  def __call__(self, x, train: bool = False, features: bool = False):
    cfg = self.cfg
    word = nn.Embed(cfg.vocab_size, cfg.width, embedding_init=dense_init(), name="word")
    if self.part != "head":
      ids_BxT = check_tokens(cfg, x)
      t = ids_BxT.shape[1]
      pos = self.param("position", nn.initializers.normal(0.01), (cfg.max_len, cfg.width))
      x_BxTxD = word(ids_BxT) + pos[None, :t]
      x_BxTxD = nn.Dropout(cfg.dropout)(x_BxTxD, deterministic=not train)
      if self.part == "embed":
        return x_BxTxD
      x = stack(cfg, pre_ln=True, causal=True, deterministic=not train)(x_BxTxD)
    h_BxTxD = nn.LayerNorm(epsilon=cfg.eps, name="ln_final")(x).astype(jnp.float32)
    return h_BxTxD if features else vocab_logits(h_BxTxD, word.embedding, dtype=compute_dtype(cfg))


GPT_AXES = A.with_blocks({
    "word/embedding": (None, A.EMBED),
    "position": (None, A.EMBED),
    **layer_norm_axes("ln_final"),
})


def positions(cfg: ModelConfig) -> int:
  """A row of ``max_len`` tokens trains on its first ``max_len - 1`` positions (each predicts the next token)."""
  return cfg.max_len - 1 if cfg.max_len > 1 else 1


def lm_head_flops(cfg: ModelConfig) -> float:
  """The LM head of a causal decoder at every trained position."""
  return 2 * positions(cfg) * cfg.width * cfg.vocab_size


GPT = register(Family(
    "gpt", Gpt, GPT_AXES, modality="text", objective="clm", pre_ln=True, tied_embedding=True, ln_eps=1e-5,
    positions=positions, head_flops=lambda cfg, objective: lm_head_flops(cfg),
    gelu_tanh=True, scaled_residual_init=True, causal=True, embedding_params=("word", "position"),
    output_embedding=lambda params: (params["word"]["embedding"], None)))
