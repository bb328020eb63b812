"""Cross-entropy through a tied vocabulary layer, whole or in chunks that never hold all the (tokens x vocab) logits.

``cross_entropy_sums(h, embedding, bias, labels, weights, ...)`` takes the features the vocabulary layer reads
(``Family.output_embedding``, ``features=True`` of the text models) and returns the objective's sums. Below
``max_logits`` logits it computes them in one piece; above, it splits the positions into chunks and runs a
``lax.scan`` whose step computes one chunk's logits, its loss terms, and, when differentiated, that chunk's
gradients with respect to the features, the embedding and the bias (a ``custom_vjp``). Nothing of size
(tokens x vocab) outlives a step, and the backward pass only scales the stored gradients by the incoming cotangent:
no logits are recomputed (a ``jax.checkpoint``-ed chunk would recompute them, one more 2 N d V matmul), so the
chunked step does the same matmuls as the unchunked one and the analytic FLOPs stay exact.

Chunks split the positions of each row (axis 1), never the rows, so a batch sharded over devices stays sharded.
Both paths compute each token's loss with the same function; their sums differ only by float32 summation order.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from multilevel.models.transformer import vocab_logits


def _token_terms(h_BxMxD, embedding_VxD, bias_V, labels_BxM, dtype):
  """Logits, their log-sum-exp, and each token's loss and hit for one chunk (or the whole batch)."""
  logits_BxMxV = vocab_logits(h_BxMxD, embedding_VxD, bias_V, dtype)
  lse_BxM = jax.nn.logsumexp(logits_BxMxV, axis=-1)
  label_logit_BxM = jnp.take_along_axis(logits_BxMxV, labels_BxM[..., None], axis=-1)[..., 0]
  correct_BxM = (jnp.argmax(logits_BxMxV, axis=-1) == labels_BxM).astype(jnp.float32)
  return logits_BxMxV, lse_BxM, lse_BxM - label_logit_BxM, correct_BxM


def _chunk_sums(h_BxMxD, embedding_VxD, bias_V, labels_BxM, weights_BxM, dtype):
  _, _, ce_BxM, correct_BxM = _token_terms(h_BxMxD, embedding_VxD, bias_V, labels_BxM, dtype)
  return jnp.sum(ce_BxM * weights_BxM), jnp.sum(correct_BxM * weights_BxM)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _chunked(h_CxBxMxD, embedding_VxD, bias_V, labels_CxBxM, weights_CxBxM, dtype):
  """(loss_sum, correct_sum) over chunks on the leading axis; only the loss is differentiable."""
  def body(acc, xs):
    h_BxMxD, labels_BxM, weights_BxM = xs
    loss, correct = _chunk_sums(h_BxMxD, embedding_VxD, bias_V, labels_BxM, weights_BxM, dtype)
    return (acc[0] + loss, acc[1] + correct), None

  zero = jnp.zeros((), jnp.float32)
  (loss, correct), _ = jax.lax.scan(body, (zero, zero), (h_CxBxMxD, labels_CxBxM, weights_CxBxM))
  return loss, correct


def _chunked_fwd(h_CxBxMxD, embedding_VxD, bias_V, labels_CxBxM, weights_CxBxM, dtype):
  def body(acc, xs):
    loss, correct, d_emb_VxD, d_bias_V = acc
    h_BxMxD, labels_BxM, weights_BxM = xs
    logits_BxMxV, lse_BxM, ce_BxM, correct_BxM = _token_terms(h_BxMxD, embedding_VxD, bias_V, labels_BxM, dtype)
    # d(sum_t w_t ce_t) / d logits = w (softmax - onehot): formed, used and dropped inside this step.
    onehot_BxMxV = jax.nn.one_hot(labels_BxM, logits_BxMxV.shape[-1], dtype=jnp.float32)
    d_logits_BxMxV = (jnp.exp(logits_BxMxV - lse_BxM[..., None]) - onehot_BxMxV) * weights_BxM[..., None]
    d_logits_BxMxV = d_logits_BxMxV.astype(dtype)
    d_h_BxMxD = jnp.einsum("bmv,vd->bmd", d_logits_BxMxV, embedding_VxD.astype(dtype),
                           preferred_element_type=jnp.float32)
    d_emb_VxD = d_emb_VxD + jnp.einsum("bmv,bmd->vd", d_logits_BxMxV, h_BxMxD.astype(dtype),
                                       preferred_element_type=jnp.float32)
    if d_bias_V is not None:
      d_bias_V = d_bias_V + jnp.sum(d_logits_BxMxV.astype(jnp.float32), axis=(0, 1))
    acc = (loss + jnp.sum(ce_BxM * weights_BxM), correct + jnp.sum(correct_BxM * weights_BxM), d_emb_VxD, d_bias_V)
    return acc, d_h_BxMxD.astype(h_BxMxD.dtype)

  zero = jnp.zeros((), jnp.float32)
  init = (zero, zero, jnp.zeros(embedding_VxD.shape, jnp.float32),
          None if bias_V is None else jnp.zeros(bias_V.shape, jnp.float32))
  (loss, correct, d_emb_VxD, d_bias_V), d_h_CxBxMxD = jax.lax.scan(
      body, init, (h_CxBxMxD, labels_CxBxM, weights_CxBxM))
  d_bias_V = None if d_bias_V is None else d_bias_V.astype(bias_V.dtype)
  return (loss, correct), (d_h_CxBxMxD, d_emb_VxD.astype(embedding_VxD.dtype), d_bias_V)


def _chunked_bwd(dtype, residuals, cotangents):
  d_h, d_emb, d_bias = residuals
  g = cotangents[0]  # The correct-count output is not differentiable (an argmax).
  scale = lambda x: None if x is None else x * g.astype(x.dtype)
  return scale(d_h), scale(d_emb), scale(d_bias), None, None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def num_chunks(tokens: int, vocab: int, max_logits: int) -> int:
  """Chunks the loss uses for ``tokens`` x ``vocab`` logits: 1 up to ``max_logits`` (0 = never chunk)."""
  if max_logits <= 0 or tokens * vocab <= max_logits:
    return 1
  return math.ceil(tokens * vocab / max_logits)


def cross_entropy_sums(h_BxTxD, embedding_VxD, bias_V, labels_BxT, weights_BxT, *, dtype=jnp.float32,
                       max_logits: int = 0) -> dict:
  """``{'loss_sum', 'count', 'correct'}`` of the softmax cross-entropy of ``h @ embedding.T + bias`` against integer
  ``labels``, each token weighted by ``weights`` (0 = not predicted). ``max_logits``: above this many logits
  (B x T x V) the positions are split into equal chunks along T (padded with weight 0) of at most about that many
  logits each; 0 never chunks."""
  b, t = labels_BxT.shape
  v = embedding_VxD.shape[0]
  weights_BxT = weights_BxT.astype(jnp.float32)
  count = jnp.sum(weights_BxT)
  c = min(num_chunks(b * t, v, max_logits), t)
  if c == 1:
    loss, correct = _chunk_sums(h_BxTxD, embedding_VxD, bias_V, labels_BxT, weights_BxT, jnp.dtype(dtype))
    return {"loss_sum": loss, "count": count, "correct": correct}
  m = math.ceil(t / c)
  pad = c * m - t
  if pad:
    h_BxTxD = jnp.pad(h_BxTxD, ((0, 0), (0, pad), (0, 0)))
    labels_BxT = jnp.pad(labels_BxT, ((0, 0), (0, pad)))
    weights_BxT = jnp.pad(weights_BxT, ((0, 0), (0, pad)))
  chunks = lambda x: jnp.moveaxis(x.reshape((b, c, m) + x.shape[2:]), 1, 0)  # (B, T) -> (C, B, M): rows intact.
  loss, correct = _chunked(chunks(h_BxTxD), embedding_VxD, bias_V, chunks(labels_BxT), chunks(weights_BxT),
                           jnp.dtype(dtype))
  return {"loss_sum": loss, "count": count, "correct": correct}
