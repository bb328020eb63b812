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
    # LLaMA-style shapes (parameter counts equal to the Hugging Face models'). Llama 3.2 1B's with its rotary
    # settings too (base 500000, "llama3" rescaling as in its config.json), so its checkpoint imports onto it.
    "smollm-135m": ModelConfig("llama", 30, 9, 64, num_kv_heads=3, ffn_size=1536, vocab_size=49152, max_len=2048,
                               tie_embeddings=True),
    "llama-3.2-1b": ModelConfig("llama", 16, 32, 64, num_kv_heads=8, ffn_size=8192, vocab_size=128256,
                                max_len=131072, rope_base=500000.0, rope_scaling="llama3", rope_factor=32.0,
                                rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=8192,
                                tie_embeddings=True),
    # Tiny sizes that train on a laptop CPU.
    "bert-tiny": ModelConfig("bert", 4, 4, 32, vocab_size=2048, max_len=128),
    "gpt-tiny": ModelConfig("gpt", 4, 4, 32, vocab_size=2048, max_len=128),
    "deit-tiny": ModelConfig("deit", 4, 4, 32, image_size=28, patch_size=4, num_channels=1, num_classes=10),
    "llama-tiny": ModelConfig("llama", 4, 4, 32, num_kv_heads=2, ffn_size=344, vocab_size=2048, max_len=128),
    # Unit-test sizes.
    "bert-test": ModelConfig("bert", 2, 2, 16, vocab_size=128, max_len=16),
    "gpt-test": ModelConfig("gpt", 2, 2, 16, vocab_size=128, max_len=16),
    "deit-test": ModelConfig("deit", 2, 2, 16, image_size=8, patch_size=4, num_channels=1, num_classes=5),
    "llama-test": ModelConfig("llama", 2, 4, 8, num_kv_heads=2, ffn_size=48, vocab_size=128, max_len=16),
}


def preset(name: str, **overrides) -> ModelConfig:
  """Returns the named preset with ``overrides`` applied, e.g. ``preset('gpt2', vocab_size=8192)``."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; choose one of {sorted(PRESETS)}.")
  return PRESETS[name].replace(**overrides)
