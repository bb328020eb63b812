"""Hugging Face interoperability: import and export BERT, GPT-2, Llama, ViT and DeiT weights.

Supported ``transformers`` architectures (``supported_architectures()``), one module each:

- ``bert.py``: ``BertForMaskedLM``, ``BertForPreTraining`` -> ``bert`` (the pooler and NSP head are dropped).
- ``gpt2.py``: ``GPT2LMHeadModel``, ``GPT2Model`` -> ``gpt`` (the LM head is the tied token embedding).
- ``llama.py``: ``LlamaForCausalLM`` -> ``llama`` (tied or untied head; rotary scaling variants are refused).
- ``vit.py``: ``ViTForImageClassification``, ``DeiTForImageClassificationWithTeacher``,
  ``DeiTForImageClassification`` -> ``deit`` (``distill_token`` for DeiT; ``vit.py`` says how each maps).

Import (``load_hf``) reads a ``save_pretrained`` directory (``model.safetensors``, sharded safetensors,
``pytorch_model.bin``), a single ``.safetensors`` / ``.bin`` file, an in-memory state dict, or an in-memory
``transformers`` model. It is strict: a checkpoint of another architecture, an unsupported setting, a missing
tensor, an unexpected tensor, a tensor of the wrong shape or an unreadable file raises an ``HFInteropError``
subclass, so no parameter is ever left at a random initial value. The only tensors dropped on purpose are those
that cannot change the logits of the model we build (each architecture's ``ignored`` patterns: BERT's pooler and
NSP head, GPT-2's causal-mask buffers, ViT's pooler); tied copies of the embeddings are checked to be equal, not
dropped blindly.

Export (``save_hf``) writes ``config.json`` and ``model.safetensors`` with the tensor names ``save_pretrained``
writes, so ``AutoModel...from_pretrained(dir)`` loads it with no missing or unexpected keys. Import and export
need only ``numpy`` and ``safetensors``; ``torch`` is needed for ``.bin`` files and in-memory models, and
``transformers`` only for ``to_hf_model``.

Parameter trees come back as nested dicts of float32 ``numpy`` arrays (place them on devices as you like).

This module holds the entry points and the file I/O; ``hf_common`` the errors, the ``HFArchitecture`` record and
the strict checks; ``bert``, ``gpt2``, ``llama`` and ``vit`` one architecture each. A new architecture is a new
module with its ``ARCHITECTURES`` records, added to ``REGISTRY`` below.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from multilevel.interop import bert, gpt2, llama, vit
from multilevel.interop.hf_common import (  # The error classes are part of this module's API.
    CheckpointFileError, HFInteropError, MissingTensorError, Registry, TensorShapeError, UnexpectedTensorError,
    UnsupportedArchitectureError, UnsupportedConfigError, check_tensors, check_tree, config_dict, name_list,
    normalise, read_json, to_numpy, unreadable)
from multilevel.models.config import ModelConfig
from multilevel.tree import flatten

PathLike = str | os.PathLike

REGISTRY = Registry(*bert.ARCHITECTURES, *gpt2.ARCHITECTURES, *llama.ARCHITECTURES, *vit.ARCHITECTURES)


# ---------------------------------------------------------------------------------------------------- entry points


def supported_architectures() -> list[str]:
  """The ``transformers`` class names ``load_hf`` imports."""
  return REGISTRY.names()


def config_from_hf(config, architecture: str | None = None) -> ModelConfig:
  """Our ``ModelConfig`` for a Hugging Face config (object, dict or ``config.json`` path). Raises if unsupported."""
  d = config_dict(config)
  return REGISTRY.resolve(d, (), architecture).config_from_hf(d)


def to_hf_config(cfg: ModelConfig) -> dict:
  """The ``config.json`` contents (a plain dict) of the Hugging Face model equivalent to ``cfg``."""
  return REGISTRY.for_export(cfg).to_hf_config(cfg)


def from_hf_state_dict(state_dict: Mapping[str, Any], config, architecture: str | None = None,
                       **overrides) -> tuple[ModelConfig, dict]:
  """``(ModelConfig, params)`` from a Hugging Face state dict (numpy arrays or torch tensors) and its config.

  ``architecture`` (e.g. ``"BertForMaskedLM"``) overrides ``config.architectures``. ``overrides`` may set the
  fields HF does not describe: ``dtype``, ``remat``, ``dropout``, ``attention`` (the kernel), ``scan_unroll``.
  """
  d = config_dict(config)
  sd = {k: to_numpy(v) for k, v in state_dict.items()}
  bad = sorted(k for k, v in sd.items() if np.issubdtype(np.asarray(v).dtype, np.floating)
               and not np.isfinite(v).all())  # In the tensor's own dtype: no float32 copy just for the check.
  if bad:
    raise HFInteropError(f"The checkpoint holds NaN or infinity in {name_list(bad)}: it is damaged or its training "
                         f"diverged. Nothing was imported.")
  a = REGISTRY.resolve(d, sd.keys(), architecture)
  cfg = a.config_from_hf(d)
  bad = sorted(set(overrides) - {"dtype", "remat", "dropout", "attention", "scan_unroll"})
  if bad:
    raise HFInteropError(f"Only dtype, remat, dropout, attention and scan_unroll may be overridden on import, not "
                         f"{bad}: the rest comes from the checkpoint.")
  cfg = cfg.replace(**overrides)
  sd = normalise(a, sd, cfg, d)
  check_tensors(a, sd, cfg)
  params = a.from_hf(cfg, {k: np.asarray(v, dtype=np.float32) for k, v in sd.items()})
  check_tree(cfg, params, "import")
  return cfg, params


def to_hf_state_dict(cfg: ModelConfig, params) -> dict[str, np.ndarray]:
  """Our ``params`` as a Hugging Face state dict (name -> float32 numpy array), with the names
  ``save_pretrained`` writes (tied copies left out, as it does)."""
  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)  # What we write: exact for bf16.
  check_tree(cfg, params, "to_hf_state_dict")
  bad = [n for n, x in sorted(flatten(params).items()) if not np.isfinite(np.asarray(x)).all()]
  if bad:
    raise HFInteropError(f"The parameters hold NaN or infinity in {name_list(bad)} (from a run that diverged?); "
                         f"nothing was exported. Export the parameters of an earlier checkpoint.")
  sd = REGISTRY.for_export(cfg).to_hf(cfg, params)
  return {k: np.array(v, dtype=np.float32, order="C") for k, v in sd.items()}  # Writable copies.


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def load_hf(source, *, config=None, architecture: str | None = None, **overrides) -> tuple[ModelConfig, dict]:
  """``(ModelConfig, params)`` from a Hugging Face checkpoint, ready for ``multilevel.models.apply``.

  ``source`` is one of: a ``save_pretrained`` directory; a weights file (``.safetensors``, ``.bin``, a shard
  ``.index.json``) with ``config.json`` beside it or ``config=``; a state dict (with ``config=``); or an in-memory
  ``transformers`` model. Nothing is downloaded: a hub name is not a path and fails. ``overrides`` may set
  ``dtype``, ``remat``, ``dropout``, ``attention`` or ``scan_unroll``.
  """
  if hasattr(source, "state_dict") and hasattr(source, "config") and not isinstance(source, (str, os.PathLike)):
    arch = architecture or type(source).__name__
    return from_hf_state_dict(source.state_dict(), config if config is not None else source.config, arch,
                              **overrides)
  if isinstance(source, Mapping):
    return from_hf_state_dict(source, config, architecture, **overrides)
  if not isinstance(source, (str, os.PathLike)):
    raise HFInteropError(f"load_hf takes a save_pretrained folder, a weights file, a state dict (with config=) or a "
                         f"transformers model, got {type(source).__name__}.")
  path = Path(source)
  if path.is_dir():
    files = [path / f for f in _WEIGHT_FILES if (path / f).is_file()]
    if not files:
      raise HFInteropError(f"No weights in {path}: expected one of {list(_WEIGHT_FILES)}.")
    weights, cfg_src = files[0], config if config is not None else path
  elif path.is_file():
    weights, cfg_src = path, config if config is not None else path.parent
  else:
    raise HFInteropError(f"{source!r} is neither a directory nor a file (hub names are not downloaded).")
  return from_hf_state_dict(_read_weights(weights), cfg_src, architecture, **overrides)


def save_hf(cfg: ModelConfig, params, out_dir: PathLike, labels: Sequence[str] | None = None,
            token_ids: Mapping[str, int] | None = None) -> Path:
  """Writes ``config.json`` and ``model.safetensors`` to ``out_dir`` so that
  ``transformers.AutoModelFor...from_pretrained(out_dir)`` (or the class in ``config.architectures``) loads it.
  ``labels``: a classifier's class names in label order (its ``id2label``; ``LABEL_i`` without them).
  ``token_ids``: the tokenizer's special ids for ``config.json`` (``eos_token_id``, ``bos_token_id``,
  ``pad_token_id``), so that ``generate`` stops at the end of a document."""
  from safetensors.numpy import save_file
  out = Path(out_dir)
  if out.exists() and not out.is_dir():
    raise HFInteropError(f"{out} is a file: save_hf writes config.json and model.safetensors into a folder.")
  hf_config = to_hf_config(cfg)
  if labels:
    labels = [str(x) for x in labels]
    if "id2label" not in hf_config or len(labels) != cfg.num_classes or len(set(labels)) != len(labels):
      raise HFInteropError(f"labels must name each of a classifier's {cfg.num_classes} classes once; got "
                           f"{len(labels)} for a {cfg.family} model.")
    hf_config["id2label"] = {str(i): name for i, name in enumerate(labels)}
    hf_config["label2id"] = {name: i for i, name in enumerate(labels)}
  for key, value in (token_ids or {}).items():
    if key not in ("eos_token_id", "bos_token_id", "pad_token_id") or not 0 <= int(value) < cfg.vocab_size:
      raise HFInteropError(f"token_ids takes eos_token_id, bos_token_id and pad_token_id in [0, {cfg.vocab_size}); "
                           f"got {key}={value}.")
    hf_config[key] = int(value)
  out.mkdir(parents=True, exist_ok=True)
  save_file(to_hf_state_dict(cfg, params), str(out / "model.safetensors"), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
  return out


def check_inputs(summary: Mapping) -> None:
  """Refuses a run whose tokenizer file is gone (``save_inputs`` would export a model no one can feed)."""
  path = (summary.get("tokenizer") or {}).get("path")
  if path and not os.path.isfile(path):
    raise HFInteropError(f"The run's tokenizer {path} is gone, and the model is no use without it: put the "
                         f"tokenizer.json the run trained with there, then export again.")


def save_inputs(out_dir: PathLike, cfg: ModelConfig, summary: Mapping) -> list[str]:
  """Writes beside exported weights what a run's inputs need, from its ``summary.json``: its tokenizer
  (``tokenizer.json`` with a ``tokenizer_config.json`` that ``AutoTokenizer`` reads) or its images' normalisation
  (``preprocessor_config.json`` for ``AutoImageProcessor``). Returns what it wrote, in words."""
  out, written = Path(out_dir), []
  check_inputs(summary)
  tok = summary.get("tokenizer") or {}
  if tok.get("path"):
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(tok["path"])
    t.save(str(out / "tokenizer.json"))
    names = {"eos_token": tok.get("eos_id"), "pad_token": tok.get("pad_id"), "mask_token": tok.get("mask_id")}
    special = {k: t.id_to_token(i) for k, i in names.items() if isinstance(i, int) and i >= 0}
    if special.get("eos_token"):
      special["bos_token"] = special["eos_token"]  # Documents start after an end-of-document token.
    # split_special_tokens: '<eos>' written in a text is text, as the run's token files encoded it.
    _write_json(out / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                "model_max_length": cfg.max_len, "split_special_tokens": True,
                                                **special})
    written.append("its tokenizer")
  norm = summary.get("image_normalization")
  if norm:
    # As training fitted the images: the short side resized (bicubic) to image_size, then a centre crop; a run with
    # data.resize False resampled nothing (it zero-padded smaller images, which no HF processor does), so neither
    # does its processor: give it images of image_size.
    resize = bool(norm.get("resize", True))
    _write_json(out / "preprocessor_config.json", {
        "image_processor_type": "CLIPImageProcessor", "do_resize": resize, "size": {"shortest_edge": cfg.image_size},
        "resample": 3, "do_center_crop": resize, "crop_size": {"height": cfg.image_size, "width": cfg.image_size},
        "do_convert_rgb": False, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": list(norm["mean"]), "image_std": list(norm["std"])})
    written.append("its image normalisation")
  return written


def _write_json(path: Path, d: Mapping) -> None:
  path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")


def to_hf_model(cfg: ModelConfig, params):
  """The ``transformers`` model (eval mode, float32) equivalent to ``(cfg, params)``; needs torch and
  transformers. Goes through ``save_hf`` so it is exactly what ``from_pretrained`` gives."""
  import tempfile

  import transformers

  with tempfile.TemporaryDirectory() as tmp:
    save_hf(cfg, params, tmp)
    arch = to_hf_config(cfg)["architectures"][0]
    model, info = getattr(transformers, arch).from_pretrained(tmp, output_loading_info=True)
  bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
  if bad:
    raise HFInteropError(f"transformers did not load every exported tensor: {bad}")
  return model.eval()


# -------------------------------------------------------------------------------------------------------- file I/O


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
  from safetensors import SafetensorError, safe_open
  try:
    try:
      with safe_open(str(path), framework="np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}
    except (TypeError, ValueError):  # bfloat16 has no numpy dtype: go through torch.
      with safe_open(str(path), framework="pt") as f:
        return {k: to_numpy(f.get_tensor(k)) for k in f.keys()}
  except (SafetensorError, OSError) as e:
    raise unreadable(path, "safetensors", e) from None


def _read_torch(path: Path) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError as e:
    raise HFInteropError(f"Reading {path.name} needs torch (pip install torch); safetensors files do not.") from e
  try:
    sd = torch.load(str(path), map_location="cpu", weights_only=True)
  except Exception as e:  # A bad file surfaces as KeyError, EOFError, OSError, RuntimeError, UnpicklingError, ...
    raise unreadable(path, "torch", e) from None
  if not isinstance(sd, Mapping):
    raise HFInteropError(f"{path} does not hold a state dict (got {type(sd).__name__}).")
  return {k: to_numpy(v) for k, v in sd.items()}


def _read_shards(index_path: Path) -> dict[str, np.ndarray]:
  index = read_json(index_path, "shard index")
  weight_map = index.get("weight_map") if isinstance(index, dict) else None
  if not isinstance(weight_map, Mapping):
    raise CheckpointFileError(f"{index_path} is not a shard index (it has no weight_map): export the checkpoint "
                              "again or download it again.")
  shards = sorted(set(weight_map.values()))
  missing = [s for s in shards if not (index_path.parent / s).is_file()]
  if missing:
    raise CheckpointFileError(
        f"{index_path} lists {len(missing)} shard(s) that are not in {index_path.parent}: {name_list(missing)}. "
        "Download the missing shards again, or point at the folder that holds all of them.")
  out = {}
  for shard in shards:
    out.update(_read_weights(index_path.parent / shard))
  return out


def _read_weights(path: Path) -> dict[str, np.ndarray]:
  if path.name.endswith(".index.json"):
    return _read_shards(path)
  if path.suffix == ".safetensors":
    return _read_safetensors(path)
  if path.suffix in (".bin", ".pt", ".pth"):
    return _read_torch(path)
  raise HFInteropError(f"Unknown weights file {path}: expected .safetensors, .bin, .pt, .pth or an .index.json.")
