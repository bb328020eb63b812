"""Tests of multilevel.interop: Hugging Face import/export, logit parity with transformers, the sources and formats
it reads, and a finished run's export. Its refusals (other architectures, settings, missing or unexpected tensors)
are in test_interop_refusals.py, damaged files in test_interop_errors.py.

Tiny, randomly initialised transformers models built from config objects: nothing is downloaded. The whole module
is skipped when torch, transformers or safetensors is not installed (pip install -e '.[hf]').
"""

import json
import os
import sys

import jax
import numpy as np
import pytest

from tests.hf_util import (TOL, VISION, I, M, assert_trees_equal, bert_config, family_of, hf_logits, make,
                           our_logits, seeded, torch, transformers)
from safetensors.numpy import load_file, save_file  # noqa: E402  (after hf_util, which skips without safetensors)


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
  model = seeded(lambda: transformers.ViTForImageClassification(transformers.ViTConfig(**VISION, qkv_bias=False)))
  assert not any("q_proj.bias" in k or "query.bias" in k for k in model.state_dict())
  cfg, params = I.load_hf(model)
  assert not np.any(params["layers"]["attn"]["query"]["bias"])
  assert np.abs(our_logits(cfg, params) - hf_logits(model, "deit")).max() < TOL


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
  assert c2 == cfg.replace(scan_unroll=0)  # The run's layer loop (tests/engine_util.py) is not in HF's config.
  assert_trees_equal(p2, params)
  # The run's tokenizer and its end-of-document id go with the weights: AutoTokenizer reads the same ids, and
  # generate knows where a document ends.
  import json

  import transformers
  from tokenizers import Tokenizer
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  ours = Tokenizer.from_file(summary["tokenizer"]["path"])
  text = "Now is the winter of our discontent"
  assert tok(text)["input_ids"] == ours.encode(text, add_special_tokens=False).ids
  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert hf_config["eos_token_id"] == summary["tokenizer"]["eos_id"] == tok.eos_token_id
  assert "with its tokenizer" in proc.stdout
  ours.encode_special_tokens = True  # As the run's token files encode a special token written in a text.
  assert tok("to <eos> be")["input_ids"] == ours.encode("to <eos> be", add_special_tokens=False).ids
  # The run keeps its tokenizer in its workdir (a cache can be cleared); without it, nothing is exported.
  assert summary["tokenizer"]["path"] == os.path.join(work, "tokenizer.json")
  os.remove(summary["tokenizer"]["path"])
  cmd2 = cmd[:-1] + [f"--out={tmp_path / 'hf2'}"]
  gone = subprocess.run(cmd2, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert gone.returncode == 1 and "tokenizer.json is gone, and the model is no use without it" in gone.stderr
  assert not (tmp_path / "hf2").exists()
  os.remove(os.path.join(work, "summary.json"))
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith("error: No summary.json")
