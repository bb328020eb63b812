"""BERT (masked LM) on the bundled Shakespeare corpus by default.

  python -m experiments.train --config=experiments/configs/bert.py:tiny --workdir=runs/bert-tiny

Sizes: test (unit tests), tiny (minutes on a laptop CPU), base and large (the paper's models, GPU).
"""

from experiments.configs.common import sized_config

SIZES = {
    "test": dict(preset="bert-test", max_len=32, steps=40, batch=8, vocab=512, lr=3e-3),
    "tiny": dict(preset="bert-tiny", max_len=128, steps=600, batch=32, vocab=2048, lr=1e-3),
    "base": dict(preset="bert-base", max_len=128, steps=300_000, batch=256, vocab=30522, lr=1e-4),
    "large": dict(preset="bert-large", max_len=128, steps=300_000, batch=256, vocab=30522, lr=1e-4, levels=3),
}


def _customize(c, s, size):
  del size
  c.model.max_len = s["max_len"]
  c.data.vocab_size = s["vocab"]
  c.cycle.levels = s.get("levels", 2)
  c.cycle.w_pre = 0.5  # The paper's value for BERT.
  # Post-LN: zero-initialised layer copies do not keep BERT's function, and the reference growth won in
  # benchmarks/results/saving_bert_summary.json (34% / 31% FLOPs saved at 3 / 7 tokens per parameter).
  c.cycle.depth_growth = "copy"
  c.cycle.transition_warmup_frac = 0.0


def get_config(arg: str = "tiny"):
  return sized_config("bert", SIZES, arg, _customize)
