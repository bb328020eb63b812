"""Scaled dot-product attention for every family, as plain functions on ``(batch, length, heads, head_dim)`` arrays.

``attend`` runs ``jax.nn.dot_product_attention``: XLA's implementation on CPUs (and wherever cuDNN cannot take the
shapes), cuDNN's fused flash-attention kernel on NVIDIA GPUs for bf16/fp16 (``ModelConfig.attention``: ``auto``
picks it there, ``cudnn`` insists on it, ``xla`` never uses it). ``jax.nn.dot_product_attention`` has no dropout, so
where a model trains with attention-probability dropout (``ModelConfig.dropout > 0``, as Hugging Face's BERT, GPT-2
and ViT do) the caller passes ``dropout`` and the step takes the explicit path, which materialises the (T x S)
probabilities to drop them. ``implementation="explicit"`` selects that path without dropout (the reference the
tests compare the fused path with).

Keys and values may have fewer heads than the queries (grouped-query attention, heads divisible by kv heads).
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "explicit")

_log = logging.getLogger(__name__)
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


def padding_mask(mask_BxS) -> jax.Array | None:
  """A ``(batch, keys)`` 0/1 or bool mask of the keys to attend to -> the boolean ``(B, 1, 1, S)`` mask that
  ``jax.nn.dot_product_attention`` broadcasts over heads and queries."""
  return None if mask_BxS is None else mask_BxS[:, None, None, :].astype(bool)


def explicit_attention(q_BxTxNxK, k_BxSxGxK, v_BxSxGxK, *, causal: bool, mask_BxS=None,
                       dropout: Callable[[jax.Array], jax.Array] | None = None):
  """The (T x S) logits materialised in float32, softmax, ``dropout`` on the probabilities if given, mixing.

  Masked logits are set to float32's minimum, so a query that sees no key averages all values (as before the fused
  path existed; ``jax.nn.dot_product_attention`` does the same with its own large negative number)."""
  n, g = q_BxTxNxK.shape[2], k_BxSxGxK.shape[2]
  if n != g:  # Grouped-query attention: each key/value head serves n // g query heads.
    k_BxSxGxK = jnp.repeat(k_BxSxGxK, n // g, axis=2)
    v_BxSxGxK = jnp.repeat(v_BxSxGxK, n // g, axis=2)
  logits_BxNxTxS = jnp.einsum("btnk,bsnk->bnts", q_BxTxNxK, k_BxSxGxK, preferred_element_type=jnp.float32)
  logits_BxNxTxS = logits_BxNxTxS / math.sqrt(q_BxTxNxK.shape[-1])
  t, s = q_BxTxNxK.shape[1], k_BxSxGxK.shape[1]
  allowed = jnp.ones((1, 1, t, s), bool)
  if causal:
    allowed = jnp.tril(allowed)
  if mask_BxS is not None:
    allowed = allowed & padding_mask(mask_BxS)
  logits_BxNxTxS = jnp.where(allowed, logits_BxNxTxS, jnp.finfo(jnp.float32).min)
  probs_BxNxTxS = jax.nn.softmax(logits_BxNxTxS, axis=-1).astype(v_BxSxGxK.dtype)
  if dropout is not None:
    probs_BxNxTxS = dropout(probs_BxNxTxS)
  return jnp.einsum("bnts,bsnk->btnk", probs_BxNxTxS, v_BxSxGxK)


def _use_cudnn(implementation: str, dtype) -> bool:
  if implementation == "cudnn":
    return True
  return implementation == "auto" and jax.default_backend() == "gpu" and jnp.dtype(dtype) in _CUDNN_DTYPES


def attend(q_BxTxNxK, k_BxSxGxK, v_BxSxGxK, *, causal: bool, mask_BxS=None, implementation: str = "auto",
           dropout: Callable[[jax.Array], jax.Array] | None = None):
  """Attention output ``(B, T, N, K)`` of queries ``q`` over keys ``k`` and values ``v``; ``mask_BxS`` (1 = attend)
  hides padded keys, ``causal`` the future. ``dropout`` (a function on the probabilities) forces the explicit path.

  With ``implementation="auto"`` on a GPU, a shape cuDNN refuses at trace time (its head-dim and sequence-length
  rules) falls back to XLA with one log line; ``"cudnn"`` raises instead."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"Attention implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}.")
  if dropout is not None or implementation == "explicit":
    return explicit_attention(q_BxTxNxK, k_BxSxGxK, v_BxSxGxK, causal=causal, mask_BxS=mask_BxS, dropout=dropout)
  mask = padding_mask(mask_BxS)
  if _use_cudnn(implementation, q_BxTxNxK.dtype):
    try:
      return jax.nn.dot_product_attention(q_BxTxNxK, k_BxSxGxK, v_BxSxGxK, mask=mask, is_causal=causal,
                                          implementation="cudnn")
    except (NotImplementedError, ValueError, RuntimeError) as e:
      if implementation == "cudnn":
        raise
      _log.info("cuDNN attention unavailable for q %s %s (%s); using XLA's.", q_BxTxNxK.shape, q_BxTxNxK.dtype, e)
  return jax.nn.dot_product_attention(q_BxTxNxK, k_BxSxGxK, v_BxSxGxK, mask=mask, is_causal=causal,
                                      implementation="xla")
