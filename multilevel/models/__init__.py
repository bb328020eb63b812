"""BERT, GPT and DeiT in Flax Linen on one transformer core, with layers stacked on a leading axis."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from multilevel.models.config import FAMILIES, PRESETS, ModelConfig, preset
from multilevel.models.families import FAMILY, Bert, Deit, Gpt


def build(cfg: ModelConfig):
  """The Flax module for ``cfg``."""
  return FAMILY[cfg.family].module(cfg)


def dummy_inputs(cfg: ModelConfig, batch: int = 1):
  """Inputs of the right shape and dtype for ``init`` and shape evaluation."""
  if cfg.family == "deit":
    return (jnp.zeros((batch, cfg.image_size, cfg.image_size, cfg.num_channels), jnp.float32),)
  return (jnp.zeros((batch, cfg.max_len), jnp.int32),)


def init_params(cfg: ModelConfig, rng) -> dict:
  """Freshly initialised parameters (a plain nested dict) for ``cfg``."""
  if isinstance(rng, int):
    rng = jax.random.key(rng)
  return build(cfg).init({"params": rng}, *dummy_inputs(cfg))["params"]


@functools.lru_cache(maxsize=64)
def abstract_params(cfg: ModelConfig) -> dict:
  """Shapes and dtypes of the parameters of ``cfg`` (``jax.ShapeDtypeStruct`` leaves), without allocating."""
  return jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))


def apply(cfg: ModelConfig, params, *inputs, train: bool = False, rngs=None, **kw):
  """Runs the model: logits for ``inputs`` (tokens for BERT/GPT, images for DeiT)."""
  return build(cfg).apply({"params": params}, *inputs, train=train, rngs=rngs, **kw)


def num_params(params, exclude_embeddings: bool = False) -> int:
  """Parameter count; with ``exclude_embeddings`` the token and position tables are left out (as in 6N FLOPs)."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  total = 0
  for path, leaf in flat:
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if exclude_embeddings and name.split("/")[0] in ("word", "position", "token_type", "pos"):
      continue
    total += int(np.prod(leaf.shape))
  return total


__all__ = ["FAMILIES", "FAMILY", "PRESETS", "ModelConfig", "preset", "build", "init_params", "abstract_params",
           "apply", "dummy_inputs", "num_params", "Bert", "Gpt", "Deit"]
