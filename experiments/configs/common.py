"""The config tree shared by every family: model, data, train, cycle, checkpoint. Family files fill in sizes."""

from __future__ import annotations

import ml_collections

from multilevel.models import PRESETS


def base_config(model_preset: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  model = PRESETS[model_preset].to_dict()
  c.model = ml_collections.ConfigDict(model)

  from multilevel.data import default_config as data_default
  c.data = data_default()

  t = c.train = ml_collections.ConfigDict()
  t.steps = 600  # The budget T: steps of plain training; the V-cycle's stages are fractions of it.
  t.batch_size = 32
  t.lr = 1e-3  # Peak learning rate of the target model.
  t.warmup_frac = 0.05
  t.decay = "linear"  # linear | cosine | constant
  t.weight_decay = 0.01
  t.b1, t.b2, t.eps = 0.9, 0.999, 1e-8
  t.grad_clip = 1.0
  t.grad_accum = 1
  t.seed = 42
  t.num_devices = 0  # 0: one device on CPU, all devices on GPU/TPU.
  t.mlm_prob = 0.15
  t.label_smoothing = 0.1
  t.mixup_alpha = 0.0
  t.log_every = 10
  t.eval_every = 50

  v = c.cycle = ml_collections.ConfigDict()
  v.levels = 2  # 1 = plain training from scratch (the baseline).
  v.width_factor = 2
  v.depth_factor = 2
  v.depth_mode = "adjacent"  # adjacent (paper) | stride (reference L6-H6.json)
  v.width_schemes = ""  # JSON: one width scheme per transition, e.g. "[[[0,2],[1,3]]]"; '' = default halving.
  v.depth_schemes = ""
  v.embed_factor = 0.0  # 0 = the group size (the reference's 2 for pairs).
  # Defaults are what won in benchmarks/ (README, "Does it save compute?"); ",reference" after the size in
  # --config=...py:tiny,reference restores the paper's protocol (no warm-up, plain copies, reference GPT width rule).
  v.preln_exact = False  # Function-preserving width growth for pre-LN GPT (method.md 5.2); the family files set it.
  v.depth_growth = "zero"  # copy (reference) | scaled | zero (function-preserving depth growth for pre-LN models)
  # Per level, target model first; cut to the number of levels used.
  v.down_fracs = (0.05, 0.05, 0.05)  # Steps at each level before coalescing, as fractions of train.steps.
  v.small_frac = 0.5  # Steps at the smallest level.
  v.up_fracs = (0.5, 0.25, 0.25)  # Steps at each level after growing back (level 0 = the final stage).
  v.lr_scales = (1.0, 4.0, 4.0)  # Peak learning rate of each level, relative to train.lr.
  v.w_pre = 0.5  # Interpolation weight of the pre-coalescing model.
  v.split_noise = 0.0  # >0: zero-sum noise on the grown copies' read side (keeps the function, breaks symmetry).
  v.optimizer_policy = "reset"  # reset (paper) | carry (map Adam's moments through the same operators)
  v.transition_warmup_frac = 0.05  # Linear warm-up after each transition, as a fraction of the stage (ref.: 0).
  v.final_schedule = "restart"  # restart (reference) | baseline_tail (continue scratch's decay)
  v.restart_control = False  # Control: random weights at each transition instead of transferred ones.

  k = c.checkpoint = ml_collections.ConfigDict()
  k.every = 200
  k.keep = 2
  k.async_save = True

  c.init_from = ""  # A Hugging Face checkpoint (directory or file) to start the target model from.
  c.progress = True
  c.tensorboard = True
  return c


def apply_size(c: ml_collections.ConfigDict, preset: str) -> None:
  """Replaces the model section by a preset (keeping vocab_size=0 for text models: use the tokenizer's size)."""
  d = PRESETS[preset].to_dict()
  if d["family"] != "deit":
    d["vocab_size"] = 0
  for key, value in d.items():
    c.model[key] = value


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
