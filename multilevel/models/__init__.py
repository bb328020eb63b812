"""BERT, GPT and DeiT in Flax Linen on one transformer core, and LLaMA-style decoders, with layers stacked on a
leading axis."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from multilevel.models.config import ModelConfig
from multilevel.models.families import FAMILY, Bert, Deit, Family, Gpt, Llama, family_of
from multilevel.models.presets import PRESETS, preset
from multilevel.tree import check_same_structure, flatten


FAMILIES = tuple(FAMILY)


def build(cfg: ModelConfig):
  """The Flax module for ``cfg``."""
  return family_of(cfg).module(cfg)


def dummy_inputs(cfg: ModelConfig, batch: int = 1):
  """Inputs of the right shape and dtype for ``init`` and shape evaluation.

  Text inputs are at most 8 tokens long: no parameter's shape or initial value depends on the length, and ``init``
  runs the forward pass, whose attention at ``max_len`` (Llama 3.2's 131072) would not fit in memory.
  """
  if family_of(cfg).is_text:
    return (jnp.zeros((batch, min(cfg.max_len, 8)), jnp.int32),)
  return (jnp.zeros((batch, cfg.image_size, cfg.image_size, cfg.num_channels), jnp.float32),)


def init_params(cfg: ModelConfig, rng) -> dict:
  """Freshly initialised parameters (a plain nested dict) for ``cfg``."""
  if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
    rng = jax.random.key(int(rng))
  return build(cfg).init({"params": rng}, *dummy_inputs(cfg))["params"]


@functools.lru_cache(maxsize=64)
def abstract_params(cfg: ModelConfig) -> dict:
  """Shapes and dtypes of the parameters of ``cfg`` (``jax.ShapeDtypeStruct`` leaves), without allocating."""
  return jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))


@functools.lru_cache(maxsize=64)
def _param_names(cfg: ModelConfig) -> frozenset:
  return frozenset(flatten(abstract_params(cfg)))


def apply(cfg: ModelConfig, params, *inputs, train: bool = False, rngs=None, **kw):
  """Runs the model: logits for ``inputs`` (tokens for BERT, GPT and LLaMA, images for DeiT). A tree with other
  parameters than ``cfg``'s model has (an untied head given to a tied config, an extra entry) is refused, not run
  without them."""
  if hasattr(params, "keys") and frozenset(flatten(params)) != _param_names(cfg):
    check_params(params, cfg)  # Flax would ignore an extra parameter: say which one.
  try:
    return build(cfg).apply({"params": params}, *inputs, train=train, rngs=rngs, **kw)
  except Exception as e:  # Flax and lax speak of scan lengths and initializer shapes; say which tree does not fit.
    try:
      check_params(params, cfg)
    except ValueError as mismatch:
      raise mismatch from e
    raise


def num_params(params, exclude_embeddings: bool = False) -> int:
  """Parameter count; with ``exclude_embeddings`` the token and position tables are left out (as in 6N FLOPs)."""
  embedding_names = {n for f in FAMILY.values() for n in f.embedding_params}
  total = 0
  for name, leaf in flatten(params).items():
    if exclude_embeddings and name.split("/")[0] in embedding_names:
      continue
    total += int(np.prod(leaf.shape))
  return total


def check_params(params, cfg: ModelConfig, what: str = "params") -> None:
  """Raises ValueError unless ``params`` has exactly the structure, shapes and dtypes of a fresh model of ``cfg``."""
  if hasattr(params, "keys") and set(params.keys()) == {"params"}:
    raise ValueError(f"{what} is wrapped as {{'params': ...}} (Flax's variables): pass tree['params'], the "
                     f"parameters themselves.")
  check_same_structure(params, abstract_params(cfg), what,
                       f"a {cfg.family} model with L={cfg.num_layers}, heads={cfg.num_heads}, width={cfg.width}")


__all__ = ["FAMILIES", "FAMILY", "Family", "family_of", "PRESETS", "ModelConfig", "preset", "build", "init_params", "abstract_params",
           "apply", "dummy_inputs", "num_params", "check_params", "Bert", "Gpt", "Deit", "Llama"]
