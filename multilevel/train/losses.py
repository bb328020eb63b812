"""Cross-entropy through a tied vocabulary layer, in chunks of positions that never hold all the (tokens x vocab)
logits at once.

``cross_entropy_sums(h, embedding, bias, labels, weights, ...)`` takes the features the vocabulary layer reads
(``Family.output_embedding``, ``features=True`` of the text models) and returns the objective's sums. It splits the
positions into chunks of at most ``max_logits`` logits (one chunk when they all fit) and runs a ``lax.scan`` whose
step computes one chunk's logits, its loss terms, and, when differentiated, that chunk's gradients with respect to
the features, the embedding and the bias (a ``custom_vjp``). Nothing of size (tokens x vocab) outlives a step, and
the backward pass only scales the stored gradients by the incoming cotangent: no logits are recomputed (a
``jax.checkpoint``-ed chunk would recompute them, one more 2 N d V matmul), so the step does the matmuls of a plain
autodiff loss and the analytic FLOPs stay exact.

Two things make this faster than differentiating the plain loss, and not only smaller (``benchmarks/loss_head.py``):
no (tokens x vocab) scatter or argmax (the label's logit is a masked sum, a hit is the label's logit reaching the
row's maximum, so a tie counts as a hit), and on CPUs chunks sized for the cache (``max_logits=-1``, the default:
2^20 logits, 4 MiB in float32, on the CPU backend; 2^25 elsewhere, where the chunks only bound memory).

Chunks split the positions of each row (axis 1), never the rows, so a batch sharded over devices stays sharded.
Every chunk size computes each token's loss with the same function; the sums differ only by float32 summation order.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from multilevel.models.transformer import vocab_logits


AUTO_MAX_LOGITS = -1
CPU_CHUNK_LOGITS = 1 << 20  # 4 MiB of float32 logits: the best of 2^18-2^20 over three shapes (loss_head.py).
ACCELERATOR_MAX_LOGITS = 1 << 25  # 128 MiB: only a memory bound; a GPU runs large chunks best.


def resolve_max_logits(max_logits: int, backend: str | None = None) -> int:
  """``max_logits`` as the loss uses it: -1 (auto) is ``CPU_CHUNK_LOGITS`` on the CPU backend and
  ``ACCELERATOR_MAX_LOGITS`` on others (``backend``: default JAX's); 0 and positive values are kept."""
  if max_logits != AUTO_MAX_LOGITS:
    if max_logits < 0:
      raise ValueError(f"max_logits must be -1 (auto), 0 (one chunk) or positive, got {max_logits}.")
    return max_logits
  return CPU_CHUNK_LOGITS if (backend or jax.default_backend()) == "cpu" else ACCELERATOR_MAX_LOGITS


def _token_terms(h_BxMxD, embedding_VxD, bias_V, labels_BxM, dtype):
  """Logits, their log-sum-exp, each token's loss and hit, and the label's one-hot mask, for one chunk. The label's
  logit is a masked sum and a hit is that logit reaching the row's maximum (a tie counts): no gather, whose
  gradient is a (tokens x vocab) scatter, and no argmax, a slow variadic reduction on CPUs."""
  logits_BxMxV = vocab_logits(h_BxMxD, embedding_VxD, bias_V, dtype)
  max_BxM = jnp.max(logits_BxMxV, axis=-1)
  lse_BxM = max_BxM + jnp.log(jnp.sum(jnp.exp(logits_BxMxV - max_BxM[..., None]), axis=-1))
  label_BxMxV = jax.lax.broadcasted_iota(labels_BxM.dtype, logits_BxMxV.shape, 2) == labels_BxM[..., None]
  label_logit_BxM = jnp.sum(jnp.where(label_BxMxV, logits_BxMxV, 0.0), axis=-1)
  correct_BxM = (label_logit_BxM >= max_BxM).astype(jnp.float32)
  return logits_BxMxV, lse_BxM, lse_BxM - label_logit_BxM, correct_BxM, label_BxMxV


def _chunk_sums(h_BxMxD, embedding_VxD, bias_V, labels_BxM, weights_BxM, dtype):
  _, _, ce_BxM, correct_BxM, _ = _token_terms(h_BxMxD, embedding_VxD, bias_V, labels_BxM, dtype)
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
    logits_BxMxV, lse_BxM, ce_BxM, correct_BxM, label_BxMxV = _token_terms(h_BxMxD, embedding_VxD, bias_V,
                                                                           labels_BxM, dtype)
    # d(sum_t w_t ce_t) / d logits = w (softmax - onehot): formed, used and dropped inside this step.
    softmax_BxMxV = jnp.exp(logits_BxMxV - lse_BxM[..., None])
    d_logits_BxMxV = (softmax_BxMxV - label_BxMxV.astype(jnp.float32)) * weights_BxM[..., None]
    d_logits_BxMxV = d_logits_BxMxV.astype(dtype)
    d_h_BxMxD = jnp.einsum("bmv,vd->bmd", d_logits_BxMxV, embedding_VxD.astype(dtype),
                           preferred_element_type=jnp.float32)
    # The embedding's gradient as (h^T d_logits)^T over the flattened tokens: XLA's CPU matmul then reads the large
    # (tokens x vocab) operand as it lies and transposes only the small ones (measured: loss_head.py).
    n = d_logits_BxMxV.shape[0] * d_logits_BxMxV.shape[1]
    h_DxN = h_BxMxD.astype(dtype).reshape(n, -1).T
    d_emb_VxD = d_emb_VxD + jnp.dot(h_DxN, d_logits_BxMxV.reshape(n, -1), preferred_element_type=jnp.float32).T
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
  """Chunks the loss uses for ``tokens`` x ``vocab`` logits: 1 up to ``max_logits`` (0 = never chunk; -1 = auto,
  ``resolve_max_logits``)."""
  max_logits = resolve_max_logits(max_logits)
  if max_logits == 0 or tokens * vocab <= max_logits:
    return 1
  return math.ceil(tokens * vocab / max_logits)


def cross_entropy_sums(h_BxTxD, embedding_VxD, bias_V, labels_BxT, weights_BxT, *, dtype=jnp.float32,
                       max_logits: int = AUTO_MAX_LOGITS) -> dict:
  """``{'loss_sum', 'count', 'correct'}`` of the softmax cross-entropy of ``h @ embedding.T + bias`` against integer
  ``labels``, each token weighted by ``weights`` (0 = not predicted); ``correct`` counts the tokens whose label's
  logit is the row's maximum (ties count). The positions are split into equal chunks along T (padded with weight 0)
  of at most about ``max_logits`` logits (B x chunk x V) each; 0 = one chunk, -1 = auto (``resolve_max_logits``)."""
  b, t = labels_BxT.shape
  v = embedding_VxD.shape[0]
  weights_BxT = weights_BxT.astype(jnp.float32)
  count = jnp.sum(weights_BxT)
  c = min(num_chunks(b * t, v, max_logits), t)
  m = math.ceil(t / c)
  pad = c * m - t
  if pad:
    h_BxTxD = jnp.pad(h_BxTxD, ((0, 0), (0, pad), (0, 0)))
    labels_BxT = jnp.pad(labels_BxT, ((0, 0), (0, pad)))
    weights_BxT = jnp.pad(weights_BxT, ((0, 0), (0, pad)))
  chunks = lambda x: jnp.moveaxis(x.reshape((b, c, m) + x.shape[2:]), 1, 0)  # (B, T) -> (C, B, M): rows intact.
  with jax.named_scope("vocab_loss"):  # Names the loss head's ops in profiles (benchmarks/step_profile.py).
    loss, correct = _chunked(chunks(h_BxTxD), embedding_VxD, bias_V, chunks(labels_BxT), chunks(weights_BxT),
                             jnp.dtype(dtype))
  return {"loss_sum": loss, "count": count, "correct": correct}
