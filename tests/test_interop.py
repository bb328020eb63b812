"""Tests of multilevel.interop: Hugging Face import/export, logit parity with transformers, strict errors.

Tiny, randomly initialised transformers models built from config objects: nothing is downloaded. The whole module
is skipped when torch, transformers or safetensors is not installed (pip install -e '.[hf]').
"""

import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported anywhere
os.environ["TRANSFORMERS_OFFLINE"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.numpy import load_file, save_file  # noqa: E402

import multilevel.models as M  # noqa: E402
from multilevel import interop as I  # noqa: E402

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


def make(name, seed=0):
  if name == "bert":
    return perturb(transformers.BertForMaskedLM(bert_config()), seed)
  if name == "gpt":
    return perturb(transformers.GPT2LMHeadModel(gpt_config()), seed)
  if name == "vit":
    return perturb(transformers.ViTForImageClassification(transformers.ViTConfig(**VISION)), seed)
  if name == "deit":
    return perturb(transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(**VISION)), seed)
  if name == "deit-single":
    return perturb(transformers.DeiTForImageClassification(transformers.DeiTConfig(**VISION)), seed)
  raise ValueError(name)


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


# --------------------------------------------------------------------------------------------------------- parity


@pytest.mark.parametrize("name", ["bert", "gpt", "vit", "deit", "deit-single"])
def test_import_matches_transformers_logits(name):
  model = make(name)
  cfg, params = I.load_hf(model)
  assert cfg.family == family_of(name)
  assert cfg.distill_token == name.startswith("deit")
  ref = hf_logits(model, cfg.family)
  assert np.abs(ref).max() > 0.3  # Non-trivial logits.
  diff = np.abs(our_logits(cfg, params) - ref).max()
  print(f"{name}: max |logit diff| = {diff:.2e}")
  assert diff < TOL
  if name == "bert":  # Also with no mask and default token types.
    assert np.abs(our_logits(cfg, params, mask=False) - hf_logits(model, "bert", mask=False)).max() < TOL


@pytest.mark.parametrize("name", ["bert", "gpt", "vit", "deit"])
def test_export_import_round_trip_is_bit_exact(name, tmp_path):
  cfg, params = I.load_hf(make(name, seed=1))
  # And from our own random init, which has exact zeros (DeiT heads, biases) and ones (LayerNorms).
  cfg0 = cfg.replace(dropout=0.0)
  params0 = jax.tree_util.tree_map(np.asarray, M.init_params(cfg0, 3))
  for c, p in ((cfg, params), (cfg0, params0)):
    out = I.save_hf(c, p, tmp_path / f"{c.dropout}")
    c2, p2 = I.load_hf(out)
    assert c2 == c
    assert_trees_equal(p2, p)
    # The state dict alone (no file) round-trips too.
    c3, p3 = I.from_hf_state_dict(I.to_hf_state_dict(c, p), I.to_hf_config(c))
    assert c3 == c
    assert_trees_equal(p3, p)


@pytest.mark.parametrize("name", ["bert", "gpt", "vit", "deit"])
def test_export_loads_in_transformers_with_same_logits(name, tmp_path):
  cfg, _ = I.load_hf(make(name))
  params = jax.tree_util.tree_map(np.asarray, M.init_params(cfg, 5))
  params = jax.tree_util.tree_map(
      lambda x: x + 0.2 * np.random.default_rng(x.size).standard_normal(x.shape).astype(np.float32), params)
  out = I.save_hf(cfg, params, tmp_path / "ours")
  arch = json.loads((out / "config.json").read_text())["architectures"][0]
  model, info = getattr(transformers, arch).from_pretrained(out, output_loading_info=True)
  model.eval()
  assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  diff = np.abs(hf_logits(model, cfg.family) - our_logits(cfg, params)).max()
  print(f"{name}: exported max |logit diff| = {diff:.2e}")
  assert diff < TOL
  # transformers writes back exactly the tensors and names we wrote.
  model.save_pretrained(tmp_path / "theirs")
  ours, theirs = load_file(out / "model.safetensors"), load_file(tmp_path / "theirs" / "model.safetensors")
  assert sorted(ours) == sorted(theirs)
  assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
  # Importing the transformers model gives our tree back bit for bit.
  cfg2, params2 = I.load_hf(model)
  assert cfg2 == cfg
  assert_trees_equal(params2, params)
  assert np.abs(hf_logits(I.to_hf_model(cfg, params), cfg.family) - our_logits(cfg, params)).max() < TOL


def test_hf_config_round_trip():
  for name in ("bert-test", "gpt-test", "deit-test", "bert-base", "gpt2", "deit-s"):
    cfg = M.preset(name, dropout=0.1)
    if cfg.family == "deit":
      cfg = cfg.replace(distill_token=name == "deit-s")
    back = I.config_from_hf(I.to_hf_config(cfg))
    relevant = ["family", "num_layers", "num_heads", "head_dim", "ffn_ratio", "dropout", "eps"]
    relevant += ["vocab_size", "max_len"] if cfg.family != "deit" else [
        "image_size", "patch_size", "num_channels", "num_classes", "distill_token"]
    assert {k: getattr(back, k) for k in relevant} == {k: getattr(cfg, k) for k in relevant}, name
  assert I.config_from_hf(transformers.GPT2Config()) == M.preset("gpt2", dropout=0.1)


# ---------------------------------------------------------------------------------------------- sources and formats


def test_every_source_kind_gives_the_same_tree(tmp_path):
  model = make("gpt")
  cfg, params = I.load_hf(model)
  model.save_pretrained(tmp_path / "st")
  model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
  assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  torch.save(model.state_dict(), bin_dir / "pytorch_model.bin")
  (bin_dir / "config.json").write_text(model.config.to_json_string())
  sd = {k: v.numpy() for k, v in model.state_dict().items()}
  save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, str(tmp_path / "loose.safetensors"))
  sources = [
      (tmp_path / "st", {}), (str(tmp_path / "sharded"), {}), (bin_dir, {}), (bin_dir / "pytorch_model.bin", {}),
      (tmp_path / "st" / "model.safetensors", {}),
      (tmp_path / "loose.safetensors", {"config": model.config}),
      (sd, {"config": model.config.to_dict()}),
      (model.state_dict(), {"config": tmp_path / "st" / "config.json"}),
  ]
  for src, kw in sources:
    c, p = I.load_hf(src, **kw)
    assert c == cfg, src
    assert_trees_equal(p, params)
  c, _ = I.load_hf(model, dtype="bfloat16", remat=True, dropout=0.0)
  assert (c.dtype, c.remat, c.dropout) == ("bfloat16", True, 0.0)


def test_half_precision_checkpoint_is_read_as_float32(tmp_path):
  model = make("bert").to(torch.bfloat16)
  cfg, params = I.load_hf(model)
  model.save_pretrained(tmp_path)
  cfg2, params2 = I.load_hf(tmp_path)
  assert cfg2 == cfg
  assert_trees_equal(params2, params)


def test_legacy_checkpoint_names_and_buffers():
  """Old files: no base-model prefix (GPT-2 hub files), GPT-2 causal-mask buffers, LayerNorm gamma/beta, BERT's
  pooler, NSP head and position_ids buffer, and explicit tied copies of the embeddings."""
  gpt = make("gpt")
  cfg, params = I.load_hf(gpt)
  sd = {k.removeprefix("transformer."): v for k, v in gpt.state_dict().items()}
  for i in range(cfg.num_layers):
    sd[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 16, 16))
    sd[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
  c, p = I.load_hf(sd, config=gpt.config)
  assert c == cfg
  assert_trees_equal(p, params)

  bert = make("bert")
  cfg, params = I.load_hf(bert)
  sd = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in bert.state_dict().items()}
  assert "cls.predictions.decoder.weight" in sd
  full = transformers.BertForPreTraining(bert_config())
  for k, v in full.state_dict().items():
    if "pooler" in k or "seq_relationship" in k:
      sd[k] = v
  sd["bert.embeddings.position_ids"] = torch.arange(16)[None]
  assert any(k.startswith("bert.pooler.") for k in sd) and any(k.startswith("cls.seq_relationship.") for k in sd)
  for arch in (None, "BertForPreTraining"):
    c, p = I.load_hf(sd, config=bert.config, architecture=arch)
    assert c == cfg
    assert_trees_equal(p, params)


def test_vit_without_qkv_bias_imports_zero_biases():
  model = perturb(transformers.ViTForImageClassification(transformers.ViTConfig(**VISION, qkv_bias=False)))
  assert not any("q_proj.bias" in k or "query.bias" in k for k in model.state_dict())
  cfg, params = I.load_hf(model)
  assert not np.any(params["layers"]["attn"]["query"]["bias"])
  assert np.abs(our_logits(cfg, params) - hf_logits(model, "deit")).max() < TOL


# --------------------------------------------------------------------------------------------------------- errors


def test_other_architectures_are_rejected():
  with pytest.raises(I.UnsupportedArchitectureError, match="BertForSequenceClassification"):
    I.load_hf(transformers.BertForSequenceClassification(bert_config()))
  roberta = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**TEXT, vocab_size=64))
  with pytest.raises(I.UnsupportedArchitectureError, match="RobertaForMaskedLM"):
    I.load_hf(roberta)
  with pytest.raises(I.UnsupportedArchitectureError, match="model_type 'roberta'"):
    I.load_hf(roberta.state_dict(), config=roberta.config.to_dict())  # No architectures recorded.
  with pytest.raises(I.UnsupportedArchitectureError, match="does not match model_type"):
    I.config_from_hf({"architectures": ["BertForMaskedLM"], "model_type": "gpt2"})
  gpt = make("gpt")  # GPT-2 weights under a BERT config: caught by the architecture, never half-loaded.
  with pytest.raises(I.HFInteropError):
    I.load_hf(gpt.state_dict(), config=bert_config(), architecture="BertForMaskedLM")


def test_missing_tensor_is_an_error():
  model = make("bert")
  sd = dict(model.state_dict())
  del sd["bert.encoder.layer.1.attention.self.key.bias"]
  with pytest.raises(I.MissingTensorError, match=r"bert\.encoder\.layer\.1\.attention\.self\.key\.bias"):
    I.load_hf(sd, config=model.config)
  base = transformers.BertModel(bert_config())  # The encoder alone: no MLM head.
  with pytest.raises(I.MissingTensorError, match=r"cls\.predictions"):
    I.load_hf(base.state_dict(), config=bert_config(), architecture="BertForMaskedLM")
  vit = make("vit")
  sd = {k: v for k, v in vit.state_dict().items() if not k.startswith("classifier.")}
  with pytest.raises(I.MissingTensorError, match="classifier"):
    I.load_hf(sd, config=vit.config)


def test_unexpected_tensor_is_an_error():
  model = make("gpt")
  sd = dict(model.state_dict())
  sd["transformer.h.2.ln_1.weight"] = sd["transformer.h.1.ln_1.weight"]  # A third layer the config does not have.
  with pytest.raises(I.UnexpectedTensorError, match=r"transformer\.h\.2\.ln_1\.weight"):
    I.load_hf(sd, config=model.config)
  deit = make("deit")
  sd = dict(deit.state_dict())
  sd["classifier.weight"] = sd["cls_classifier.weight"]
  with pytest.raises(I.UnexpectedTensorError, match="classifier.weight"):
    I.load_hf(sd, config=deit.config)


def test_shape_mismatch_is_an_error():
  model = make("bert")
  sd = dict(model.state_dict())
  sd["bert.embeddings.position_embeddings.weight"] = torch.zeros(32, 32)
  with pytest.raises(I.TensorShapeError, match=r"position_embeddings.*\(32, 32\).*\(16, 32\)"):
    I.load_hf(sd, config=model.config)
  with pytest.raises(I.TensorShapeError, match="word_embeddings"):  # Config says another vocabulary size.
    I.load_hf(model.state_dict(), config=bert_config(vocab_size=100))
  with pytest.raises(I.TensorShapeError):  # Config says another FFN width.
    I.load_hf(make("vit").state_dict(), config=transformers.ViTConfig(**{**VISION, "intermediate_size": 64}))


def test_untied_lm_head_is_an_error():
  model = make("gpt")
  sd = dict(model.state_dict())
  sd["lm_head.weight"] = sd["lm_head.weight"] + 1.0
  with pytest.raises(I.UnsupportedConfigError, match="untied"):
    I.load_hf(sd, config=model.config)
  with pytest.raises(I.UnsupportedConfigError, match="tie_word_embeddings"):
    I.config_from_hf(gpt_config(tie_word_embeddings=False))
  bert = make("bert")
  sd = dict(bert.state_dict())
  sd["cls.predictions.decoder.weight"] = torch.zeros_like(sd["cls.predictions.decoder.weight"])
  with pytest.raises(I.UnsupportedConfigError, match="untied"):
    I.load_hf(sd, config=bert.config)


@pytest.mark.parametrize("change,match", [
    ({"hidden_act": "relu"}, "Activation 'relu'"),
    ({"num_attention_heads": 5}, "not divisible"),
    ({"intermediate_size": 100}, "not a multiple"),
    ({"position_embedding_type": "relative_key"}, "relative position"),
    ({"is_decoder": True}, "is_decoder"),
    ({"add_cross_attention": True}, "cross-attention"),
])
def test_unsupported_bert_settings(change, match):
  d = {**bert_config().to_dict(), **change}
  with pytest.raises(I.UnsupportedConfigError, match=match):
    I.config_from_hf(d)


@pytest.mark.parametrize("family,change,match", [
    ("gpt", {"activation_function": "relu"}, "Activation 'relu'"),
    ("gpt", {"activation_function": "gelu"}, "Activation 'gelu'"),  # exact gelu: our GPT uses the tanh form
    ("gpt", {"n_head": 3}, "not divisible"),
    ("gpt", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ("vit", {"hidden_act": "gelu_new"}, "Activation 'gelu_new'"),
    ("vit", {"image_size": [8, 12]}, "square"),
    ("vit", {"image_size": 10}, "not a multiple"),
    ("vit", {"id2label": {}, "num_labels": 0}, "num_labels=0"),
])
def test_unsupported_gpt_and_vision_settings(family, change, match):
  base = gpt_config().to_dict() if family == "gpt" else transformers.ViTConfig(**VISION).to_dict()
  with pytest.raises(I.UnsupportedConfigError, match=match):
    I.config_from_hf({**base, **change})


def test_bad_paths_and_overrides(tmp_path):
  with pytest.raises(I.HFInteropError, match="neither a directory nor a file"):
    I.load_hf("google-bert/bert-base-uncased")  # A hub name is not downloaded.
  with pytest.raises(I.HFInteropError, match="No weights"):
    I.load_hf(tmp_path)
  with pytest.raises(I.HFInteropError, match="No Hugging Face config"):
    I.load_hf({"x": np.zeros(1)})
  with pytest.raises(I.HFInteropError, match="num_layers"):
    I.load_hf(make("gpt"), num_layers=3)
  cfg = M.preset("gpt-test")
  params = jax.tree_util.tree_map(np.asarray, M.init_params(cfg, 0))
  with pytest.raises(I.TensorShapeError, match="shapes do not match the config"):
    I.save_hf(cfg.replace(num_layers=3), params, tmp_path / "x")


def test_a_finished_run_exports_from_its_workdir_and_an_unfinished_one_is_refused(tmp_path):
  """experiments.export writes the run's final target model (its digest checked against summary.json), which imports
  back bit-exactly; a workdir without a finished run gives one error line."""
  import subprocess

  from multilevel.checkpoint import load_run
  from multilevel.cycles.driver import train_and_evaluate
  from multilevel.metrics import params_digest
  from tests.engine_util import ROOT, tiny_config
  work = str(tmp_path / "run")
  summary = train_and_evaluate(tiny_config("gpt", levels=2, **{"train.steps": 12}), work)
  cfg, params = load_run(work)
  assert params_digest(params) == summary["params_sha256"] and cfg.to_dict() == summary["model"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1")
  cmd = [sys.executable, "-m", "experiments.export", f"--workdir={work}", f"--out={tmp_path / 'hf'}"]
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  c2, p2 = I.load_hf(tmp_path / "hf")
  assert c2 == cfg
  assert_trees_equal(p2, params)
  os.remove(os.path.join(work, "summary.json"))
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith("error: No summary.json")
