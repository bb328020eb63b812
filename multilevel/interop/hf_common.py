"""What the Hugging Face architecture modules share: the errors, reading HF configs, the ``HFArchitecture`` record
each module fills in and the ``Registry`` of them, state-dict name normalisation and the strict checks of an import.

Nothing here knows an architecture: embeddings (tied or not), biases, norms and sub-layers are the business of
the modules (``bert.py``, ``gpt2.py``, ``llama.py``, ``vit.py``). The expected tensors of an import are what the
module's ``to_hf`` writes for the config, so a new architecture needs no change here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

import jax
import numpy as np

from multilevel.models import abstract_params, check_params
from multilevel.models.config import ModelConfig
from multilevel.tree import flatten

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------------------ errors


class HFInteropError(ValueError):
  """Base class of every import/export error."""


class UnsupportedArchitectureError(HFInteropError):
  """The checkpoint is of an architecture we have no model for."""


class UnsupportedConfigError(HFInteropError):
  """The architecture is supported but one of its settings is not (activation, position embeddings, ...)."""


class MissingTensorError(HFInteropError):
  """A tensor our model needs is not in the checkpoint."""


class UnexpectedTensorError(HFInteropError):
  """The checkpoint holds a tensor that maps to nothing in our model."""


class TensorShapeError(HFInteropError):
  """A tensor's shape does not fit the configuration."""


class CheckpointFileError(HFInteropError):
  """A checkpoint file (weights, shard index, ``config.json``) is truncated, corrupt or missing."""


def name_list(keys, limit: int = 12) -> str:
  """The first ``limit`` of ``keys``, sorted, for an error message."""
  keys = sorted(keys)
  more = f" ... and {len(keys) - limit} more" if len(keys) > limit else ""
  return ", ".join(keys[:limit]) + more


def short_cause(e: BaseException) -> str:
  """A library's exception in a few words: its class and the first sentence of its message."""
  text = str(e).strip().splitlines()[0].split(". ")[0] if str(e).strip() else ""
  text = f"{type(e).__name__}: {text}" if text else type(e).__name__
  return text if len(text) <= 100 else text[:97] + "..."


# ---------------------------------------------------------------------------------------------------- HF configs


def unreadable(path: Path, what: str, e: BaseException) -> CheckpointFileError:
  """The error for a checkpoint file that a library could not read: the file, the cause, and what to do."""
  return CheckpointFileError(
      f"{path} is not a readable {what} file ({short_cause(e)}); it may be truncated or corrupt. Export the "
      "checkpoint again, download it again, or point at the folder that holds a complete one.")


def read_json(path: Path, what: str) -> Any:
  """The contents of the JSON file ``path`` (``what``: "config", "shard index"), or a ``CheckpointFileError``."""
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError) as e:  # ValueError covers JSONDecodeError and UnicodeDecodeError.
    raise unreadable(path, what, e) from None


def config_dict(config) -> dict:
  """A plain dict from a ``transformers`` config object, a dict, or a path to ``config.json`` (or its folder)."""
  if config is None:
    raise HFInteropError("No Hugging Face config: pass config= (a transformers config, a dict or a config.json "
                         "path) or a directory that holds config.json.")
  if hasattr(config, "to_dict"):
    return dict(config.to_dict())
  if isinstance(config, Mapping):
    return dict(config)
  path = Path(config)
  if path.is_dir():
    path = path / "config.json"
  if not path.is_file():
    raise HFInteropError(f"No Hugging Face config file at {path}.")
  d = read_json(path, "config")
  if not isinstance(d, dict):
    raise CheckpointFileError(f"{path} holds a JSON {type(d).__name__}, not a config object: export the checkpoint "
                              "again, download it again, or point at the folder that holds its config.json.")
  return d


def read(d: Mapping, key: str, default=None):
  """``d[key]``, or ``default`` when the key is absent or None (HF writes None for "the default")."""
  v = d.get(key, default)
  return default if v is None else v


def read_int(d: Mapping, key: str, default=None) -> int:
  """``read`` as an int; raises ``UnsupportedConfigError`` when the key is absent and has no default."""
  v = read(d, key, default)
  if v is None:
    raise UnsupportedConfigError(f"The Hugging Face config has no {key!r}.")
  return int(v)


def split_width(d: int, h: int, ffn: int, names: tuple[str, str, str]) -> tuple[int, int]:
  """``(head_dim, ffn_ratio)`` for hidden size ``d``, ``h`` heads and FFN width ``ffn``, or a clear error."""
  if h < 1 or d % h:
    raise UnsupportedConfigError(f"{names[0]}={d} is not divisible by {names[1]}={h}: the head size must be an "
                                 "integer.")
  if ffn % d:
    raise UnsupportedConfigError(f"{names[2]}={ffn} is not a multiple of {names[0]}={d}; our models need "
                                 "FFN width = ffn_ratio * width with an integer ffn_ratio.")
  return d // h, ffn // d


def ln_eps(value: float, family: str) -> float:
  """Our ``ln_eps``: -1 (the family default) when the HF value equals that default, so configs round-trip."""
  value = float(value)
  return -1.0 if value == ModelConfig(family).eps else value


def check_act(act: str, allowed: tuple[str, ...], family: str):
  if act not in allowed:
    raise UnsupportedConfigError(f"Activation {act!r} is not supported for {family}: our model uses "
                                 f"{allowed[0]!r} (accepted: {list(allowed)}).")


def check_false(d: Mapping, key: str, why: str):
  if read(d, key, False):
    raise UnsupportedConfigError(f"{key}={d[key]!r} is not supported: {why}.")


def check_tied(d: Mapping):
  """For the families whose LM head is the transposed token embedding."""
  if not read(d, "tie_word_embeddings", True):
    raise UnsupportedConfigError("tie_word_embeddings=False (an untied LM head) is not supported: our LM head is "
                                 "the transposed token embedding.")


# ------------------------------------------------------------------------------------------ architecture records


def _same_name(key: str) -> str:
  return key


@dataclasses.dataclass(frozen=True)
class HFArchitecture:
  """How one ``transformers`` class maps onto one of our families. An architecture module builds these and
  ``hf.py`` registers them. State dicts are plain dicts from HF tensor name to array; trees are nested dicts.

  Attributes:
    name: the ``transformers`` class (``config.architectures[0]``), e.g. ``"GPT2LMHeadModel"``.
    model_types: the ``config.model_type`` values it may carry.
    family: our ``ModelConfig.family``.
    config_from_hf: HF config dict -> ``ModelConfig``; raises ``UnsupportedConfigError`` on what we cannot build.
    to_hf_config: ``ModelConfig`` -> the ``config.json`` dict of the exported model.
    to_hf: ``(cfg, params)`` -> state dict with the names ``save_pretrained`` writes. It must run under
      ``jax.eval_shape``: the tensors it writes are exactly the ones an import requires.
    from_hf: ``(cfg, state dict)`` -> our float32 parameter tree, from a float32 state dict already normalised and
      checked.
    prefix: the base model's attribute ("bert", "transformer"); added to the names of a base-model checkpoint.
    heads: the top-level names that are not under ``prefix`` (left alone when adding it).
    ignored: regexes of tensors that cannot change our logits (buffers, poolers); dropped with a log line.
    aliases: tied copies, alias -> canonical name; imported only when equal to the canonical tensor.
    rename: maps one (prefixed) tensor name to the name ``to_hf`` uses (legacy or in-memory spellings).
    adapt: ``(state dict, cfg, HF config dict)`` -> state dict, for what a rename cannot do (a zero tensor the
      config leaves out, a rescaled head); runs last, after ``ignored``.
    exports: whether ``save_hf`` writes ``cfg`` (of ``family``) as this class; None: import only.
    assumed_for: for a checkpoint of one of ``model_types`` that records no architecture, whether its tensor names
      say it is this one (the first registered record that says so is taken); None: never assumed.
  """
  name: str
  model_types: tuple[str, ...]
  family: str
  config_from_hf: Callable[[Mapping], ModelConfig]
  to_hf_config: Callable[[ModelConfig], dict]
  to_hf: Callable[[ModelConfig, Mapping], dict]
  from_hf: Callable[[ModelConfig, Mapping], dict]
  prefix: str
  heads: tuple[str, ...] = ()
  ignored: tuple[str, ...] = ()
  aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
  rename: Callable[[str], str] = _same_name
  adapt: Callable[[dict, ModelConfig, Mapping], dict] | None = None
  exports: Callable[[ModelConfig], bool] | None = None
  assumed_for: Callable[[Collection[str]], bool] | None = None


class Registry:
  """The registered ``HFArchitecture`` records, by class name, and the look-ups of an import and an export."""

  def __init__(self, *archs: HFArchitecture):
    self.archs = {}
    for a in archs:
      if a.name in self.archs:
        raise ValueError(f"Architecture {a.name!r} is registered twice.")
      self.archs[a.name] = a

  def names(self) -> list[str]:
    return sorted(self.archs)

  def resolve(self, hf_config: Mapping, keys: Collection[str], name: str | None) -> HFArchitecture:
    """The record for a checkpoint: ``name`` if given, else ``config.architectures``, else its model type (and
    tensor ``keys``); raises ``UnsupportedArchitectureError`` if it is not registered or contradicts the config."""
    model_type = hf_config.get("model_type")
    if name is None:
      listed = hf_config.get("architectures") or []
      if len(listed) > 1:
        raise UnsupportedArchitectureError(f"The config lists several architectures {listed}; pass one explicitly.")
      name = listed[0] if listed else None
    if name is None:  # No recorded architecture: decide from the model type and the tensor names.
      name = next((a.name for a in self.archs.values() if model_type in a.model_types and a.assumed_for is not None
                   and a.assumed_for(keys)), None)
    if name not in self.archs:
      raise UnsupportedArchitectureError(
          f"Unsupported Hugging Face architecture {name!r} (model_type {model_type!r}); supported: {self.names()}.")
    a = self.archs[name]
    if model_type is not None and model_type not in a.model_types:
      raise UnsupportedArchitectureError(
          f"Architecture {name!r} does not match model_type {model_type!r} (expected {list(a.model_types)}).")
    return a

  def for_export(self, cfg: ModelConfig) -> HFArchitecture:
    """The record ``save_hf`` writes ``cfg`` as."""
    for a in self.archs.values():
      if a.family == cfg.family and a.exports is not None and a.exports(cfg):
        return a
    raise UnsupportedArchitectureError(f"No Hugging Face architecture is registered to export a {cfg.family} model.")


# ---------------------------------------------------------------------------------------------------- state dicts


def to_numpy(v) -> np.ndarray:
  """A numpy array from a numpy array, a torch tensor (half precision widened to float32) or an array-like."""
  if isinstance(v, np.ndarray):
    return v
  if hasattr(v, "detach"):  # torch.Tensor
    v = v.detach().to("cpu")
    if v.is_floating_point() and v.element_size() < 4:
      v = v.float()  # bfloat16 / float16: numpy has no bfloat16; everything becomes float32 anyway.
    return v.numpy()
  return np.asarray(v)


def legacy_norm_name(key: str) -> str:
  """TF-era checkpoints call a LayerNorm's weight and bias ``gamma`` and ``beta``."""
  return re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", key))


def normalise(a: HFArchitecture, sd: Mapping[str, np.ndarray], cfg: ModelConfig,
              hf_config: Mapping) -> dict[str, np.ndarray]:
  """The names and tensors ``a.from_hf`` reads: base-model prefix added, ``a.rename`` applied, tied copies checked
  and merged, ignored tensors dropped, then ``a.adapt``."""
  out = dict(sd)
  if not any(k.startswith(a.prefix + ".") for k in out):  # A checkpoint saved from the base model.
    out = {(k if k.split(".")[0] in a.heads else f"{a.prefix}.{k}"): v for k, v in out.items()}
  out = {a.rename(k): v for k, v in out.items()}
  for alias, canonical in a.aliases.items():
    if alias not in out:
      continue
    v = out.pop(alias)
    if canonical not in out:
      out[canonical] = v
    elif np.shape(v) != np.shape(out[canonical]) or not np.array_equal(v, out[canonical]):
      raise UnsupportedConfigError(f"{alias} differs from {canonical}: our {a.family} model holds one tensor for "
                                   "both, so an untied copy is not supported.")
  ignored = [k for k in out if any(re.search(p, k) for p in a.ignored)]
  if ignored:
    log.info("Ignoring tensors that do not affect %s logits: %s", a.name, name_list(ignored))
  out = {k: v for k, v in out.items() if k not in ignored}
  return a.adapt(out, cfg, hf_config) if a.adapt is not None else out


def shape_config(cfg: ModelConfig) -> ModelConfig:
  """``cfg`` with the fields that do not change parameter shapes (dtype, remat, dropout, scan_unroll) fixed."""
  return cfg.replace(dtype="float32", remat=False, dropout=0.0, scan_unroll=0)


def check_tensors(a: HFArchitecture, sd: Mapping[str, np.ndarray], cfg: ModelConfig):
  """Raises unless ``sd`` holds exactly the tensors, with the shapes, that ``a.to_hf`` writes for ``cfg``."""
  shapes = jax.eval_shape(lambda p: a.to_hf(cfg, p), abstract_params(shape_config(cfg)))
  want = {k: tuple(v.shape) for k, v in shapes.items()}
  missing, unexpected = sorted(want.keys() - sd.keys()), sorted(sd.keys() - want.keys())
  if missing:
    raise MissingTensorError(f"{len(missing)} tensor(s) missing from the {a.name} checkpoint: {name_list(missing)}"
                             + (f" (it also has unexpected ones: {name_list(unexpected)})" if unexpected else "")
                             + ".")
  if unexpected:
    raise UnexpectedTensorError(f"{len(unexpected)} unexpected tensor(s) in the {a.name} checkpoint that map to "
                                f"nothing in our {cfg.family} model: {name_list(unexpected)}.")
  wrong = [f"{k}: {tuple(np.shape(sd[k]))}, expected {want[k]}" for k in want if tuple(np.shape(sd[k])) != want[k]]
  if wrong:
    raise TensorShapeError(f"{len(wrong)} tensor(s) with a shape that does not fit the config: "
                           f"{name_list(wrong, 6)}.")


def check_tree(cfg: ModelConfig, params, where: str):
  """Raises unless ``params`` has exactly the paths, shapes and (float32) dtypes of ``cfg``'s parameters."""
  try:
    check_params(params, shape_config(cfg), "the parameters")
  except (TypeError, ValueError) as e:
    same_paths = isinstance(params, Mapping) and flatten(params).keys() == flatten(
        abstract_params(shape_config(cfg))).keys()
    if same_paths:
      raise TensorShapeError(f"{where}: parameter shapes do not match the config: {e}") from None
    raise HFInteropError(f"{where}: parameter tree does not match the config: {e}") from None


# ------------------------------------------------------------------------------------------------- tensor layouts


def heads_in_to_hf(k):
  """Ours ``(d, H, hd)`` -> ``nn.Linear`` weight ``(H*hd, d)`` (a query, key or value projection)."""
  return k.reshape(k.shape[0], -1).T


def heads_in_from_hf(w, h: int, hd: int):
  """``nn.Linear`` weight ``(H*hd, d)`` -> ours ``(d, H, hd)``."""
  return w.T.reshape(w.shape[1], h, hd)


def heads_out_to_hf(k):
  """Ours ``(H, hd, d)`` -> ``nn.Linear`` weight ``(d, H*hd)`` (the attention output projection)."""
  return k.reshape(-1, k.shape[-1]).T


def heads_out_from_hf(w, h: int, hd: int):
  """``nn.Linear`` weight ``(d, H*hd)`` -> ours ``(H, hd, d)``."""
  return w.T.reshape(h, hd, w.shape[0])


def stack(rows) -> np.ndarray:
  """Per-layer tensors stacked on our leading layer axis (float32, a new C-contiguous array)."""
  return np.stack(rows).astype(np.float32, order="C", copy=False)


def copy32(x) -> np.ndarray:
  """A C-contiguous float32 copy: the tree never shares memory with the source (e.g. a live torch model)."""
  return np.array(x, dtype=np.float32, order="C")
