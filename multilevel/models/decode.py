"""Greedy decoding for the causal families (GPT, LLaMA): each new token is the argmax of the last position's logits.

No key/value cache: every step runs the model on the whole fixed-length buffer (the causal mask makes the positions
not yet written irrelevant), so one compiled program serves every step. Meant for checks and small models (e.g.
comparing with ``transformers``' ``generate`` after an export), not for serving.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from multilevel.models.config import ModelConfig
from multilevel.models.family import family_of


@functools.partial(jax.jit, static_argnums=(0, 3))
def _greedy(cfg: ModelConfig, params, buf_BxN, start: int):
  from multilevel.models import apply

  def step(t, buf):
    logits_BxNxV = apply(cfg, params, buf)
    nxt = jnp.argmax(jax.lax.dynamic_index_in_dim(logits_BxNxV, t - 1, axis=1, keepdims=False), axis=-1)
    return jax.lax.dynamic_update_index_in_dim(buf, nxt.astype(buf.dtype), t, axis=1)

  return jax.lax.fori_loop(start, buf_BxN.shape[1], step, buf_BxN)


def greedy_decode(cfg: ModelConfig, params, prompt_BxP, new_tokens: int):
  """``prompt_BxP`` followed by ``new_tokens`` greedily decoded tokens: ``(batch, P + new_tokens)`` int32."""
  if not family_of(cfg).causal:
    raise ValueError(f"Greedy decoding needs a causal model (gpt, llama); {cfg.family} is not one.")
  prompt_BxP = jnp.asarray(prompt_BxP, jnp.int32)
  p = prompt_BxP.shape[1]
  if p < 1 or new_tokens < 0 or p + new_tokens > cfg.max_len:
    raise ValueError(f"A prompt of {p} tokens plus {new_tokens} new ones must fit in max_len={cfg.max_len} (and the "
                     f"prompt must hold at least one token).")
  buf = jnp.concatenate([prompt_BxP, jnp.zeros((prompt_BxP.shape[0], new_tokens), jnp.int32)], axis=1)
  return _greedy(cfg, params, buf, p)
