"""What the Hugging Face interop tests share: tiny, randomly initialised transformers models built from config
objects (nothing is downloaded), fixed inputs, the logits of both sides, and an exact tree comparison.

Importing it skips the importing test module when torch, transformers or safetensors is not installed
(pip install -e '.[hf]').
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported anywhere
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import multilevel.models as M  # noqa: E402
from multilevel import interop as I  # noqa: E402,F401  (the tests take it from here)

transformers.logging.set_verbosity_error()
if hasattr(transformers.utils.logging, "disable_progress_bar"):
  transformers.utils.logging.disable_progress_bar()

TOL = 1e-5  # max abs logit difference, fp32

# ------------------------------------------------------------------------------------------------- tiny HF models

TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
VISION = dict(TEXT, image_size=8, patch_size=4, num_channels=3, num_labels=5)


def bert_config(**kw):
  return transformers.BertConfig(**{**TEXT, "vocab_size": 64, "max_position_embeddings": 16, **kw})


def gpt_config(**kw):
  return transformers.GPT2Config(**{"vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 16,
                                    "bos_token_id": None, "eos_token_id": None, **kw})


def perturb(model, seed=0, scale=0.2):
  """Noise on every parameter (tied ones once), so LayerNorms, biases and tokens are not at their trivial init."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(scale * torch.randn(p.shape, generator=gen))
  return model.eval()


def seeded(factory, seed=0):
  """``perturb(factory(), seed)`` with every parameter drawn from ``seed``: transformers initialises a model from
  torch's global generator, whose state depends on what ran before in the process, so that is seeded here too (in a
  forked generator: the global state is left as it was)."""
  with torch.random.fork_rng():
    torch.manual_seed(seed)
    return perturb(factory(), seed)


def make(name, seed=0):
  """A tiny transformers model of ``name`` (bert, gpt, vit, deit, deit-single), drawn from ``seed``."""
  factory = {"bert": lambda: transformers.BertForMaskedLM(bert_config()),
             "gpt": lambda: transformers.GPT2LMHeadModel(gpt_config()),
             "vit": lambda: transformers.ViTForImageClassification(transformers.ViTConfig(**VISION)),
             "deit": lambda: transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(**VISION)),
             "deit-single": lambda: transformers.DeiTForImageClassification(transformers.DeiTConfig(**VISION))}
  if name not in factory:
    raise ValueError(name)
  return seeded(factory[name], seed)


RNG = np.random.default_rng(0)
TOKENS = RNG.integers(0, 64, (2, 12))
TYPES = RNG.integers(0, 2, (2, 12))
MASK = np.ones((2, 12), np.int64)
MASK[1, 7:] = 0
IMAGES = RNG.standard_normal((2, 8, 8, 3)).astype(np.float32)


def hf_logits(model, family, mask=True):
  with torch.no_grad():
    if family == "bert":
      kw = dict(token_type_ids=torch.tensor(TYPES), attention_mask=torch.tensor(MASK)) if mask else {}
      return model(input_ids=torch.tensor(TOKENS), **kw).logits.numpy()
    if family == "gpt":
      return model(input_ids=torch.tensor(TOKENS)).logits.numpy()
    return model(pixel_values=torch.tensor(IMAGES.transpose(0, 3, 1, 2))).logits.numpy()


def our_logits(cfg, params, mask=True):
  if cfg.family == "bert":
    kw = dict(token_types_BxT=TYPES, mask_BxT=MASK) if mask else {}
    return np.asarray(M.apply(cfg, params, TOKENS, **kw))
  if cfg.family == "gpt":
    return np.asarray(M.apply(cfg, params, TOKENS))
  return np.asarray(M.apply(cfg, params, IMAGES))


def family_of(name):
  return {"vit": "deit", "deit-single": "deit"}.get(name, name)


def assert_trees_equal(a, b):
  fa, ta = jax.tree_util.tree_flatten_with_path(a)
  fb, tb = jax.tree_util.tree_flatten_with_path(b)
  assert ta == tb
  for (path, x), (_, y) in zip(fa, fb):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype == np.float32, path
    assert x.shape == y.shape and np.array_equal(x, y), jax.tree_util.keystr(path)


