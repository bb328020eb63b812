"""Model presets: the paper's models and tiny CPU sizes, by name."""

from __future__ import annotations

from multilevel.models.config import ModelConfig

# Presets: the paper's models and tiny CPU sizes. Text presets use the GPT-2 / BERT vocabularies; a run on a
# smaller tokenizer overrides vocab_size.
PRESETS: dict[str, ModelConfig] = {
    # Paper sizes.
    "bert-base": ModelConfig("bert", 12, 12, 64, vocab_size=30522, max_len=512),
    "bert-large": ModelConfig("bert", 24, 16, 64, vocab_size=30522, max_len=512),
    "gpt2": ModelConfig("gpt", 12, 12, 64, vocab_size=50257, max_len=1024),
    "deit-s": ModelConfig("deit", 12, 6, 64, image_size=224, patch_size=16, num_classes=1000),
    "deit-b": ModelConfig("deit", 12, 12, 64, image_size=224, patch_size=16, num_classes=1000),
    # Tiny sizes that train on a laptop CPU.
    "bert-tiny": ModelConfig("bert", 4, 4, 32, vocab_size=2048, max_len=128),
    "gpt-tiny": ModelConfig("gpt", 4, 4, 32, vocab_size=2048, max_len=128),
    "deit-tiny": ModelConfig("deit", 4, 4, 32, image_size=28, patch_size=4, num_channels=1, num_classes=10),
    # Unit-test sizes.
    "bert-test": ModelConfig("bert", 2, 2, 16, vocab_size=128, max_len=16),
    "gpt-test": ModelConfig("gpt", 2, 2, 16, vocab_size=128, max_len=16),
    "deit-test": ModelConfig("deit", 2, 2, 16, image_size=8, patch_size=4, num_channels=1, num_classes=5),
}


def preset(name: str, **overrides) -> ModelConfig:
  """Returns the named preset with ``overrides`` applied, e.g. ``preset('gpt2', vocab_size=8192)``."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; choose one of {sorted(PRESETS)}.")
  return PRESETS[name].replace(**overrides)
