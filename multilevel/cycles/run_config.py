"""From a run's ConfigDict to the typed pieces: the model config, the objective, the config a checkpoint records."""

from __future__ import annotations

import json

from multilevel.models import ModelConfig
from multilevel.train.objectives import ObjectiveConfig

# Settings that do not change what is trained; a resumed run may change them freely.
NOT_RECORDED = ("progress", "tensorboard", "checkpoint", "train.log_every", "train.eval_every", "train.num_devices")


def data_kind(model: ModelConfig) -> str:
  return "images" if model.family == "deit" else "text"


def model_config(config, info) -> ModelConfig:
  """The target model; sizes left at 0 (vocabulary, classes, channels) are taken from the data."""
  d = dict(config.model.to_dict() if hasattr(config.model, "to_dict") else config.model)
  if info is not None:
    if d.get("family") != "deit":
      if not d.get("vocab_size"):
        d["vocab_size"] = int(info.vocab_size)
      elif d["vocab_size"] < info.vocab_size:
        raise ValueError(f"model.vocab_size={d['vocab_size']} is smaller than the tokenizer's {info.vocab_size} "
                         f"tokens; set it to 0 to use the tokenizer's size.")
    else:
      if not d.get("num_classes"):
        d["num_classes"] = int(info.num_classes)
      if not d.get("num_channels"):
        d["num_channels"] = int(info.image_shape[-1])
  for key, placeholder in (("vocab_size", 1), ("num_classes", 1), ("num_channels", 1)):
    d[key] = d.get(key) or placeholder
  return ModelConfig.from_dict(d)


def objective_config(config, info) -> ObjectiveConfig:
  tc = config.train
  mask_id = getattr(info, "mask_id", None)
  if config.model.family == "bert" and mask_id is None:
    raise ValueError("BERT needs a tokenizer with a '<mask>' (or '[MASK]') token; the loaded one has none.")
  return ObjectiveConfig(mask_id=int(mask_id or 0), pad_id=-1, mlm_prob=float(tc.mlm_prob),
                         label_smoothing=float(tc.label_smoothing), mixup_alpha=float(tc.mixup_alpha))


def resolved_config(config, model: ModelConfig) -> dict:
  """The JSON form of everything that determines the trained parameters (checked when a run resumes)."""
  d = json.loads(json.dumps(config.to_dict(), default=str))
  d["model"] = json.loads(json.dumps(model.to_dict()))
  for key in NOT_RECORDED:
    parts = key.split(".")
    node = d
    for p in parts[:-1]:
      node = node.get(p, {})
    node.pop(parts[-1], None)
  return d
