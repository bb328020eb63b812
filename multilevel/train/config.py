"""The ``train`` section of a run's config, typed: the budget, the optimizer, the objective's knobs, logging."""

from __future__ import annotations

import dataclasses

from multilevel.train.optim import DECAYS
from multilevel.typed_config import ConfigError, check_fields


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The ``train`` section: the budget, the optimizer, the objective's knobs, logging."""

  steps: int = 600  # The budget T: steps of plain training; the V-cycle's stages are fractions of it.
  batch_size: int = 32  # The global batch, over all devices and processes.
  lr: float = 1e-3  # Peak learning rate of the target model.
  warmup_frac: float = 0.05
  decay: str = "linear"  # linear | cosine | constant | wsd (warm-up, stable, then a linear cool-down)
  cooldown_frac: float = 0.2  # decay='wsd': the cool-down's share of the steps (of the run; per stage for methods).
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  grad_clip: float = 1.0  # Global-norm clipping; 0 turns it off.
  grad_accum: int = 1  # Microbatches per step (the batch is split into this many).
  seed: int = 42
  num_devices: int = 0  # 0: one device on CPU, all devices on GPU/TPU.
  mesh: str = ""  # Named mesh axes, e.g. "data:2,fsdp:2" (product = devices used); '' = all of them on data.
  mlm_prob: float = 0.15
  label_smoothing: float = 0.1
  mixup_alpha: float = 0.0
  # Text: the loss runs in chunks of at most about this many (tokens x vocab) logits; 0 = one chunk; -1 = auto
  # (2^20 on CPUs, sized for the cache; 2^25 on GPUs/TPUs, a memory bound: train/losses.py).
  max_logits: int = -1
  log_every: int = 10
  eval_every: int = 50  # 0: evaluate only at the end of each stage.

  def __post_init__(self):
    check_fields(self, "train")
    for name in ("steps", "batch_size", "grad_accum", "log_every"):
      if getattr(self, name) < 1:
        raise ConfigError(f"train.{name} must be a positive integer, got {getattr(self, name)}.")
    for name in ("num_devices", "eval_every", "weight_decay", "grad_clip", "mixup_alpha"):
      if getattr(self, name) < 0:
        raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}.")
    if self.max_logits < -1:
      raise ConfigError(f"train.max_logits must be -1 (auto), 0 (one chunk) or a positive number of logits per "
                        f"chunk, got {self.max_logits}.")
    if not self.lr > 0:
      raise ConfigError(f"train.lr must be positive, got {self.lr}.")
    if self.decay not in DECAYS:
      raise ConfigError(f"train.decay must be one of {DECAYS}, got {self.decay!r}.")
    if not 0 <= self.warmup_frac <= 1:
      raise ConfigError(f"train.warmup_frac must be in [0, 1], got {self.warmup_frac}.")
    if not 0 < self.cooldown_frac <= 1:
      raise ConfigError(f"train.cooldown_frac (the WSD cool-down's share of the steps) must be in (0, 1], got "
                        f"{self.cooldown_frac}.")
    if self.decay == "wsd" and self.warmup_frac + self.cooldown_frac > 1:
      raise ConfigError(f"train.warmup_frac={self.warmup_frac} + train.cooldown_frac={self.cooldown_frac} > 1: the "
                        f"warm-up and the WSD cool-down overlap; lower one of them.")
    if self.batch_size % self.grad_accum:
      raise ConfigError(f"train.batch_size={self.batch_size} cannot be split into train.grad_accum="
                        f"{self.grad_accum} equal microbatches; choose a batch size divisible by grad_accum.")
    if not 0 <= self.mlm_prob <= 1 or not 0 <= self.label_smoothing < 1:
      raise ConfigError("train.mlm_prob must be in [0, 1] and train.label_smoothing in [0, 1).")
