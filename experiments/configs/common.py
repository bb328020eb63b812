"""The config tree shared by every family: model, data, train, cycle, checkpoint. Family files fill in sizes."""

from __future__ import annotations

import dataclasses

import ml_collections

from multilevel.checkpoint import CheckpointConfig
from multilevel.cycles import CycleConfig
from multilevel.models import PRESETS, family_of
from multilevel.train.config import TrainConfig


def _section(dataclass_instance) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dataclasses.asdict(dataclass_instance))


def base_config(model_preset: str) -> ml_collections.ConfigDict:
  """Every section from the library's typed defaults (``TrainConfig``, ``CycleConfig``, ``CheckpointConfig``, the
  data package's defaults): a default lives in its dataclass only, and the family files override it."""
  c = ml_collections.ConfigDict()
  c.model = ml_collections.ConfigDict(PRESETS[model_preset].to_dict())
  from multilevel.data import default_config as data_default
  c.data = data_default()
  c.train = _section(TrainConfig())
  c.cycle = _section(CycleConfig())
  from multilevel.cycles.config import plugin_options
  from multilevel.cycles.plan import METHODS
  for name in METHODS:  # Methods registered from outside the package (imported before this runs) with options.
    if plugin_options(name) is not None:
      c.cycle[name] = _section(plugin_options(name)())
  c.checkpoint = _section(CheckpointConfig())
  c.init_from = ""  # A Hugging Face checkpoint (directory or file) to start the target model from.
  c.progress = True
  c.tensorboard = True
  return c


def apply_size(c: ml_collections.ConfigDict, preset: str) -> None:
  """Replaces the model section by a preset (keeping vocab_size=0 for text models: use the tokenizer's size)."""
  d = PRESETS[preset].to_dict()
  if family_of(d["family"]).is_text:
    d["vocab_size"] = 0
  for key, value in d.items():
    c.model[key] = value


def key_values(items: list[str], flag: str = "--set") -> dict[str, str]:
  """``--set`` (or ``flag``) values of a command line, ``["train.lr=3e-4"]``, as ``{"train.lr": "3e-4"}``, the form
  ``override`` takes; an item without '=' is a usage error naming the flag."""
  from absl import app
  bad = [kv for kv in items if "=" not in kv]
  if bad:
    raise app.UsageError(f"{flag} takes KEY=VALUE, got {bad}")
  return dict(kv.split("=", 1) for kv in items)


def load_config(spec: str) -> ml_collections.ConfigDict:
  """The ConfigDict of a config file ``path[:arg]`` (the file's ``get_config(arg)``), unlocked: how the planner reads
  its source config and how a written ``plan_config.py`` is loaded back."""
  import importlib.util
  import os

  from absl import app
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise app.UsageError(f"--config={spec}: no config file at {path}.")
  module_spec = importlib.util.spec_from_file_location("_multilevel_plan_source", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  c = module.get_config(arg) if arg else module.get_config()
  c.unlock()
  return c


def override(c: ml_collections.ConfigDict, values: dict) -> ml_collections.ConfigDict:
  """Sets dotted keys (``{"train.lr": 1e-3, "cycle.levels": 1}``) on ``c``, as ``--config.train.lr=`` does.

  Strings are parsed as the command line parses them (``"3e-4"``, ``"true"``, ``"(1.0, 2.0)"``) when the field is
  not a string; an unknown key raises naming the valid keys of its section. Returns ``c``.
  """
  import ast
  for key, value in values.items():
    node, parts = c, key.split(".")
    for i, part in enumerate(parts):
      if part not in node:
        section = ".".join(parts[:i]) or "the config"
        raise KeyError(f"unknown key {key!r}; valid keys of {section}: {', '.join(node.keys())}.")
      if i < len(parts) - 1:
        node = node[part]
    old = node[parts[-1]]
    if isinstance(value, str) and not isinstance(old, str):
      text = value.strip()
      value = {"true": True, "false": False}.get(text.lower(), None) if isinstance(old, bool) else None
      if value is None:
        value = ast.literal_eval(text)
    if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    with c.unlocked() if c.is_locked else _nothing():
      node[parts[-1]] = tuple(value) if isinstance(old, tuple) and isinstance(value, list) else value
  return c


class _nothing:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


PROTOCOLS = ("", "reference")


def split_arg(arg: str, default_size: str) -> tuple[str, str]:
  """'tiny' -> ('tiny', ''); 'tiny,reference' -> ('tiny', 'reference')."""
  size, _, protocol = (arg or default_size).partition(",")
  if protocol not in PROTOCOLS:
    raise ValueError(f"Unknown protocol {protocol!r} after the size; choose one of {PROTOCOLS[1:]} or none.")
  return size or default_size, protocol


def apply_protocol(c: ml_collections.ConfigDict, protocol: str) -> None:
  """'reference': the paper's and the official code's V-cycle, for parity runs."""
  if protocol == "reference":
    c.cycle.transition_warmup_frac = 0.0
    c.cycle.depth_growth = "copy"
    c.cycle.preln_exact = False


def sized_config(family: str, sizes: dict, arg: str, customize) -> ml_collections.ConfigDict:
  """The shared skeleton of the family files: pick the size, apply it, let the family adjust, then the protocol.

  ``arg`` is what follows the colon in ``--config=...py:<arg>``: a size, optionally ``,reference``.
  ``customize(config, size_entry, size_name)`` sets the family's own fields.
  """
  size, protocol = split_arg(arg, "tiny")
  if size not in sizes:
    raise ValueError(f"Unknown {family} size {size!r}; choose one of {sorted(sizes)}.")
  s = sizes[size]
  c = base_config(s["preset"])
  apply_size(c, s["preset"])
  c.train.steps, c.train.batch_size, c.train.lr = s["steps"], s["batch"], s["lr"]
  customize(c, s, size)
  if size == "test":  # Unit-test runs: frequent logs, evals and checkpoints, two eval batches.
    c.train.log_every, c.train.eval_every, c.checkpoint.every = 5, 20, 10
    c.data.max_eval_batches = 2
  apply_protocol(c, protocol)
  return c
