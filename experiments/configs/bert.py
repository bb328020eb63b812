"""BERT (masked LM) on the bundled Shakespeare corpus by default.

  python -m experiments.train --config=experiments/configs/bert.py:tiny --workdir=runs/bert-tiny

Sizes: test (unit tests), tiny (minutes on a laptop CPU), base and large (the paper's models, GPU).
"""

from experiments.configs.common import apply_protocol, apply_size, base_config, split_arg

SIZES = {
    "test": dict(preset="bert-test", max_len=32, steps=40, batch=8, vocab=512, lr=3e-3),
    "tiny": dict(preset="bert-tiny", max_len=128, steps=600, batch=32, vocab=2048, lr=1e-3),
    "base": dict(preset="bert-base", max_len=128, steps=300_000, batch=256, vocab=30522, lr=1e-4),
    "large": dict(preset="bert-large", max_len=128, steps=300_000, batch=256, vocab=30522, lr=1e-4, levels=3),
}


def get_config(arg: str = "tiny"):
  size, protocol = split_arg(arg, "tiny")
  if size not in SIZES:
    raise ValueError(f"Unknown bert size {size!r}; choose one of {sorted(SIZES)}.")
  s = SIZES[size]
  c = base_config(s["preset"])
  apply_size(c, s["preset"])
  c.model.max_len = s["max_len"]
  c.data.vocab_size = s["vocab"]
  c.train.steps, c.train.batch_size, c.train.lr = s["steps"], s["batch"], s["lr"]
  c.cycle.levels = s.get("levels", 2)
  c.cycle.w_pre = 0.5  # The paper's value for BERT.
  if size == "test":
    c.train.log_every, c.train.eval_every, c.checkpoint.every = 5, 20, 10
    c.data.max_eval_batches = 2
  apply_protocol(c, protocol)
  return c
