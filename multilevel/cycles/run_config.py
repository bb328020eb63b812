"""A run's config, typed once at the boundary, and what is derived from it: the model, the objective, the JSON record.

The command line and the config files keep ``ml_collections.ConfigDict`` (``--config.train.lr=...``);
``RunConfig.from_config`` turns it into frozen dataclasses (``TrainConfig``, ``CycleConfig``, ``CheckpointConfig``,
the data package's ``DataConfig``) that hold every default once and refuse unknown keys. The library reads
attributes only.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from absl import logging

from multilevel.checkpoint import CheckpointConfig
from multilevel.cycles.config import CycleConfig
from multilevel.models import ModelConfig, family_of
from multilevel.train.config import TrainConfig
from multilevel.train.objectives import ObjectiveConfig
from multilevel.typed_config import ConfigError, as_mapping, coerce, section_from

# Settings that do not change what is trained; a resumed run may change them freely.
# A run resumes on a mesh of another shape (bit-exact on the same one); what and how often it evaluates is recorded
# where an adaptive stage's end is decided at evaluations (RECORDED_IF_ADAPTIVE, resolved_config).
NOT_RECORDED = ("progress", "tensorboard", "checkpoint", "train.log_every", "train.eval_every", "train.num_devices",
                "train.mesh", "data.max_eval_batches", "data.prefetch")
RECORDED_IF_ADAPTIVE = ("train.eval_every", "data.max_eval_batches")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The whole run, typed. ``model`` stays a dict: sizes left at 0 are filled from the data (``model_config``)."""

  model: dict
  data: Any
  train: TrainConfig
  cycle: CycleConfig
  checkpoint: CheckpointConfig
  init_from: str = ""  # A Hugging Face checkpoint (directory or file) to start the target model from.
  progress: bool = True
  tensorboard: bool = True

  def __post_init__(self):
    for name in ("init_from", "progress", "tensorboard"):
      check = {"init_from": str, "progress": bool, "tensorboard": bool}[name]
      object.__setattr__(self, name, coerce(getattr(self, name), check, name))

  @classmethod
  def from_config(cls, c) -> "RunConfig":
    from multilevel.data import DataConfig  # The data stack is heavy; only a run needs it.
    if isinstance(c, RunConfig):
      return c
    d = as_mapping(c)
    sections = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - sections)
    if unknown:
      raise ConfigError(f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} at the top of the "
                        f"config; valid keys: {', '.join(f.name for f in dataclasses.fields(cls))}.")
    model = as_mapping(d.get("model"))
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    if set(model) - fields:
      raise ConfigError(f"unknown key {', '.join('model.' + k for k in sorted(set(model) - fields))}; valid keys "
                        f"of 'model': {', '.join(f.name for f in dataclasses.fields(ModelConfig))}.")
    return cls(model=model, data=DataConfig.from_config(d.get("data"), "data"),
               train=section_from(TrainConfig, d.get("train"), "train"),
               cycle=section_from(CycleConfig, d.get("cycle"), "cycle"),
               checkpoint=section_from(CheckpointConfig, d.get("checkpoint"), "checkpoint"),
               **{k: d[k] for k in ("init_from", "progress", "tensorboard") if k in d})


def data_config(run: RunConfig, fam):
  """The data config the run reads: a text run that starts from a Hugging Face checkpoint (``init_from``) with no
  tokenizer of its own takes the checkpoint's ``tokenizer.json``, since the checkpoint's embedding rows mean that
  tokenizer's ids; without one there, it trains a tokenizer as usual and says that the ids will not match."""
  from multilevel.data import DataConfig
  data = DataConfig.from_config(run.data, "data")
  if not run.init_from or not fam.is_text or data.tokenizer or data.token_file:
    return data
  source = os.path.expanduser(run.init_from)
  folder = source if os.path.isdir(source) else os.path.dirname(source)
  found = os.path.join(folder, "tokenizer.json")
  if os.path.isfile(found):
    logging.info("Tokenizer: %s, the checkpoint's own (init_from); set data.tokenizer to use another.", found)
    return dataclasses.replace(data, tokenizer=found)
  logging.warning("init_from=%s holds no tokenizer.json, and data.tokenizer is not set: the run trains its own "
                  "tokenizer, whose ids mean other text than the checkpoint's embedding rows learned. Set "
                  "data.tokenizer to the checkpoint's tokenizer.json if it has one elsewhere.", run.init_from)
  return data


def model_config(run, info) -> ModelConfig:
  """The target model of ``run`` (a RunConfig or a ConfigDict); sizes left at 0 (vocabulary, classes, channels) are
  taken from the data (``info``)."""
  d = dict(RunConfig.from_config(run).model)
  text = family_of(d.get("family", "gpt")).is_text
  if info is not None:
    if text:
      if not d.get("vocab_size"):
        d["vocab_size"] = int(info.vocab_size)
      elif d["vocab_size"] < info.vocab_size:
        raise ConfigError(f"model.vocab_size={d['vocab_size']} is smaller than the tokenizer's {info.vocab_size} "
                          f"tokens; set it to 0 to use the tokenizer's size.")
    else:
      if not d.get("num_classes"):
        d["num_classes"] = int(info.num_classes)
      elif d["num_classes"] < info.num_classes:
        raise ConfigError(f"model.num_classes={d['num_classes']} is smaller than the data's {info.num_classes} "
                          f"classes: the labels past it would train nothing. Set it to 0 to use the data's count.")
      if not d.get("num_channels"):
        d["num_channels"] = int(info.image_shape[-1])
  for key in ("vocab_size", "num_classes", "num_channels"):
    d[key] = d.get(key) or 1  # A placeholder where the data decides and is not loaded yet.
  try:
    return ModelConfig.from_dict(d)
  except ValueError as e:  # Named as the run config spells it (model.num_layers), not as the Python API does.
    raise ConfigError(str(e).replace("ModelConfig.", "model.")) from None


def objective_config(run: RunConfig, model: ModelConfig, info) -> ObjectiveConfig:
  tc = run.train
  mask_id = getattr(info, "mask_id", None)
  if family_of(model).objective == "mlm" and (mask_id is None or mask_id < 0):
    raise ConfigError("Masked-LM training needs a tokenizer with a '<mask>' (or '[MASK]') token; the loaded one has "
                      "none. Train one here (leave data.tokenizer empty) or give a tokenizer that has it.")
  return ObjectiveConfig(mask_id=int(mask_id or 0), pad_id=-1, mlm_prob=tc.mlm_prob, label_smoothing=tc.label_smoothing,
                         mixup_alpha=tc.mixup_alpha, max_logits=tc.max_logits)


def config_json(run: RunConfig) -> dict:
  """The whole run config as JSON-able data, every key (what every process of a run must agree on)."""
  d = {f.name: getattr(run, f.name) for f in dataclasses.fields(run)}
  return json.loads(json.dumps({k: v.as_dict() if isinstance(v, CycleConfig) else dataclasses.asdict(v)
                                if dataclasses.is_dataclass(v) else v for k, v in d.items()}, default=str))


def resolved_config(run: RunConfig, model: ModelConfig, adaptive: bool = False) -> dict:
  """The JSON form of everything that determines the trained parameters (checked when a run resumes). With
  ``adaptive`` (a plan whose stage ends where an evaluation decides it), ``train.eval_every`` is recorded too."""
  d = config_json(run)
  d["model"] = json.loads(json.dumps(model.to_dict()))
  for key in NOT_RECORDED:
    if not (adaptive and key in RECORDED_IF_ADAPTIVE):
      pop_key(d, key)
  return d


def _parent(d: dict, key: str) -> tuple[dict, str]:
  *path, last = key.split(".")
  for p in path:
    d = d.get(p, {})
  return d, last


def has_key(d: dict, key: str) -> bool:
  """Whether the nested ``d`` holds the dotted ``key`` ('train.eval_every', or a whole section: 'checkpoint')."""
  parent, last = _parent(d, key)
  return last in parent


def pop_key(d: dict, key: str) -> None:
  """Removes the dotted ``key`` from the nested ``d`` where it is there."""
  parent, last = _parent(d, key)
  parent.pop(last, None)


def default_resolved_config() -> dict:
  """``resolved_config`` of the library's typed defaults: what a field holds when a config does not set it."""
  return resolved_config(RunConfig.from_config({}), ModelConfig())
