"""Hugging Face state dicts <-> our parameter trees (``from_hf_state_dict``, ``to_hf_state_dict``): name
normalisation, tied copies, strict checks of missing, unexpected and mis-shaped tensors, for
``multilevel.interop.hf``."""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from multilevel.interop.hf_archs import _V5_VISION_NAMES, _Arch, _resolve_arch
from multilevel.interop.hf_config import _config_dict, _get
from multilevel.interop.hf_errors import (HFInteropError, MissingTensorError, TensorShapeError, UnexpectedTensorError,
                                          UnsupportedConfigError, _names)
from multilevel.interop.hf_tensors import _FROM_HF, _TO_HF
from multilevel.models import abstract_params
from multilevel.models.config import ModelConfig

log = logging.getLogger("multilevel.interop.hf")  # The logger's name from before the split of hf.py.


# -------------------------------------------------------------------------------------------------- state dicts


def _abstract(cfg: ModelConfig):
  """Parameter shapes of ``cfg``; dtype, remat and dropout do not change them, so they are fixed here."""
  return abstract_params(cfg.replace(dtype="float32", remat=False, dropout=0.0))


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  shapes = jax.eval_shape(lambda p: _TO_HF[cfg.family](cfg, p), _abstract(cfg))
  return {k: tuple(v.shape) for k, v in shapes.items()}


def to_hf_state_dict(cfg: ModelConfig, params) -> dict[str, np.ndarray]:
  """Our ``params`` as a Hugging Face state dict (name -> float32 numpy array), with the names
  ``save_pretrained`` writes (tied copies left out, as it does)."""
  _check_tree(cfg, params, "to_hf_state_dict")
  sd = _TO_HF[cfg.family](cfg, jax.tree_util.tree_map(jnp.asarray, params))
  return {k: np.array(v, dtype=np.float32, order="C") for k, v in sd.items()}  # Writable copies.


def _check_tree(cfg: ModelConfig, params, where: str):
  """Raises unless ``params`` has exactly the paths and shapes of ``cfg``'s parameters."""
  want = {jax.tree_util.keystr(k): tuple(v.shape)
          for k, v in jax.tree_util.tree_flatten_with_path(_abstract(cfg))[0]}
  have = {jax.tree_util.keystr(k): tuple(np.shape(v)) for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  if want.keys() != have.keys():
    raise HFInteropError(f"{where}: parameter tree does not match the config: missing "
                         f"[{_names(want.keys() - have.keys())}], extra [{_names(have.keys() - want.keys())}].")
  bad = [f"{k}: {have[k]} != {want[k]}" for k in want if have[k] != want[k]]
  if bad:
    raise TensorShapeError(f"{where}: parameter shapes do not match the config: {_names(bad)}.")


def _normalise(a: _Arch, sd: Mapping[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Canonical tensor names: legacy LayerNorm gamma/beta, a missing base-model prefix, transformers-5 in-memory
  ViT/DeiT names; tied copies checked and merged; tensors that cannot affect our logits dropped."""
  out = {}
  for k, v in sd.items():
    k = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", k))
    out[k] = v
  if not any(k.startswith(a.prefix + ".") for k in out):  # A checkpoint saved from the base model.
    out = {(k if k.split(".")[0] in a.heads else f"{a.prefix}.{k}"): v for k, v in out.items()}
  if a.family == "deit":
    renamed = {}
    for k, v in out.items():
      for pattern, repl in _V5_VISION_NAMES:
        if pattern.match(k):
          k = pattern.sub(repl, k, count=1)
          break
      renamed[k] = v
    out = renamed
  for alias, canonical in a.aliases.items():
    if alias not in out:
      continue
    v = out.pop(alias)
    if canonical not in out:
      out[canonical] = v
    elif np.shape(v) != np.shape(out[canonical]) or not np.array_equal(v, out[canonical]):
      raise UnsupportedConfigError(f"{alias} differs from {canonical}: an untied output layer is not supported "
                                   "(our LM head is tied to the token embedding).")
  if a.name == "DeiTForImageClassification":
    # One classifier on the class token, but the distillation token still attends: this equals our distilled DeiT
    # (mean of two heads) with head = 2 * classifier and a zero distillation head. Scaling by 2 is exact.
    for suffix in ("weight", "bias"):
      if f"classifier.{suffix}" in out:
        w = out.pop(f"classifier.{suffix}")
        out[f"cls_classifier.{suffix}"] = 2 * np.asarray(w, np.float32)
        out[f"distillation_classifier.{suffix}"] = np.zeros(np.shape(w), np.float32)
  ignored = [k for k in out if any(p.search(k) for p in a.ignored)]
  if ignored:
    log.info("Ignoring tensors that do not affect %s logits: %s", a.name, _names(ignored))
  return {k: v for k, v in out.items() if k not in ignored}


def from_hf_state_dict(state_dict: Mapping[str, Any], config, architecture: str | None = None,
                       **overrides) -> tuple[ModelConfig, dict]:
  """``(ModelConfig, params)`` from a Hugging Face state dict (numpy arrays or torch tensors) and its config.

  ``architecture`` (e.g. ``"BertForMaskedLM"``) overrides ``config.architectures``. ``overrides`` may set the
  fields HF does not describe: ``dtype``, ``remat``, ``dropout``.
  """
  d = _config_dict(config)
  sd = {k: _to_numpy(v) for k, v in state_dict.items()}
  a = _resolve_arch(d, sd.keys(), architecture)
  cfg = a.config_fn(d, a.name)
  bad = sorted(set(overrides) - {"dtype", "remat", "dropout"})
  if bad:
    raise HFInteropError(f"Only dtype, remat and dropout may be overridden on import, not {bad}: the rest comes "
                         "from the checkpoint.")
  cfg = cfg.replace(**overrides)
  sd = _normalise(a, sd, cfg)
  if a.family == "deit" and not _get(d, "qkv_bias", True):  # No q/k/v biases is exactly a zero bias.
    m = a.prefix
    for i in range(cfg.num_layers):
      for proj in ("query", "key", "value"):
        sd.setdefault(f"{m}.encoder.layer.{i}.attention.attention.{proj}.bias", np.zeros(cfg.width, np.float32))

  want = _expected_shapes(cfg)
  missing, unexpected = sorted(want.keys() - sd.keys()), sorted(sd.keys() - want.keys())
  if missing:
    raise MissingTensorError(f"{len(missing)} tensor(s) missing from the {a.name} checkpoint: {_names(missing)}"
                             + (f" (it also has unexpected ones: {_names(unexpected)})" if unexpected else "") + ".")
  if unexpected:
    raise UnexpectedTensorError(f"{len(unexpected)} unexpected tensor(s) in the {a.name} checkpoint that map to "
                                f"nothing in our {cfg.family} model: {_names(unexpected)}.")
  wrong = [f"{k}: {tuple(np.shape(sd[k]))}, expected {want[k]}" for k in want if tuple(np.shape(sd[k])) != want[k]]
  if wrong:
    raise TensorShapeError(f"{len(wrong)} tensor(s) with a shape that does not fit the config: {_names(wrong, 6)}.")
  sd = {k: np.asarray(v, dtype=np.float32) for k, v in sd.items()}
  params = _FROM_HF[cfg.family](cfg, sd)
  _check_tree(cfg, params, "import")
  return cfg, params


def _to_numpy(v) -> np.ndarray:
  if isinstance(v, np.ndarray):
    return v
  if hasattr(v, "detach"):  # torch.Tensor
    v = v.detach().to("cpu")
    if v.is_floating_point() and v.element_size() < 4:
      v = v.float()  # bfloat16 / float16: numpy has no bfloat16; everything becomes float32 anyway.
    return v.numpy()
  return np.asarray(v)

