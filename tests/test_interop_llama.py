"""Hugging Face ``LlamaForCausalLM`` import and export: logit parity, bit-exact round trips, ``generate`` against our
greedy decode, preset sizes against HF's, and the settings we refuse.

Tiny random models built from config objects (grouped-query attention, a non-default rotary base, tied and untied
heads); nothing is downloaded. Skipped when torch, transformers or safetensors is missing.
"""

import jax
import numpy as np
import pytest

from multilevel.models.decode import greedy_decode
# Skips this module without torch / transformers.
from tests.hf_util import TOL, I, M, assert_trees_equal, torch, transformers

TOKENS = np.random.default_rng(0).integers(0, 64, (2, 12))


def hf_config(**kw):
  base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=1e-5, rope_theta=500000.0,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
  return transformers.LlamaConfig(**{**base, **kw})


def make(seed=0, scale=0.2, **kw):
  """A random tiny HF Llama with noise on every parameter (tied ones once), so the norms are not all ones."""
  torch.manual_seed(seed)
  model = transformers.LlamaForCausalLM(hf_config(**kw))
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(scale * torch.randn(p.shape, generator=gen))
  return model.eval()


def hf_logits(model, tokens=TOKENS):
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens)).logits.numpy()


@pytest.mark.parametrize("tie", [False, True])
def test_import_matches_transformers_logits(tie):
  model = make(tie_word_embeddings=tie)
  cfg, params = I.load_hf(model)
  assert (cfg.family, cfg.num_kv_heads, cfg.ffn_dim, cfg.rope_base, cfg.tie_embeddings) == ("llama", 2, 48, 5e5, tie)
  ref = hf_logits(model)
  assert np.abs(ref).max() > 0.3
  diff = np.abs(np.asarray(M.apply(cfg, params, TOKENS)) - ref).max()
  print(f"llama tie={tie}: max |logit diff| = {diff:.2e}")
  assert diff < TOL


def test_export_import_round_trip_and_generate(tmp_path):
  """Our tree -> save_hf -> transformers: same logits, the same tensors written back, the tree back bit for bit
  (through files and through state dicts), and ``generate`` equal to our greedy decode."""
  cfg = M.preset("llama-test")
  params = jax.tree_util.tree_map(np.asarray, M.init_params(cfg, 5))
  params = jax.tree_util.tree_map(
      lambda x: x + 0.2 * np.random.default_rng(x.size).standard_normal(x.shape).astype(np.float32), params)
  out = I.save_hf(cfg, params, tmp_path / "ours")
  c2, p2 = I.load_hf(out)
  assert c2 == cfg
  assert_trees_equal(p2, params)
  c3, p3 = I.from_hf_state_dict(I.to_hf_state_dict(cfg, params), I.to_hf_config(cfg))
  assert c3 == cfg
  assert_trees_equal(p3, params)
  model, info = transformers.LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
  model.eval()
  assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  diff = np.abs(hf_logits(model) - np.asarray(M.apply(cfg, params, TOKENS))).max()
  print(f"llama exported: max |logit diff| = {diff:.2e}")
  assert diff < TOL
  c4, p4 = I.load_hf(model)  # The live transformers model gives our tree back bit for bit.
  assert c4 == cfg
  assert_trees_equal(p4, params)
  prompt = TOKENS[:, :4]
  with torch.no_grad():
    theirs = model.generate(torch.tensor(prompt), max_new_tokens=10, do_sample=False, min_new_tokens=10).numpy()
  ours = np.asarray(greedy_decode(cfg, params, prompt, 10))
  np.testing.assert_array_equal(ours, theirs)
  assert len({tuple(r) for r in ours[:, 4:].tolist()}) > 1 or len(set(ours[0, 4:].tolist())) > 1  # Not constant.


@pytest.mark.parametrize("name", ["smollm-135m", "llama-3.2-1b"])
def test_preset_sizes_equal_transformers(name):
  """Our preset exported as a config, built by transformers on the meta device (no memory): same parameter count."""
  cfg = M.preset(name)
  hf = I.to_hf_config(cfg)
  with torch.device("meta"):
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf))
  assert sum(p.numel() for p in model.parameters()) == M.num_params(M.abstract_params(cfg))
  assert I.config_from_hf(hf) == cfg


@pytest.mark.parametrize("change, match", [
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "of type 'linear' is not supported"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "of type 'dynamic' is not supported"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0], "long_factor": [2.0]}},
     "of type 'longrope' is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "of type 'yarn' is not supported"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    ({"attention_bias": True}, "attention_bias=True"),
    ({"mlp_bias": True}, "mlp_bias=True"),
    ({"hidden_act": "gelu"}, "Activation 'gelu'"),
    ({"head_dim": 16}, "head_dim=16 x num_attention_heads=4"),
    ({"attention_dropout": 0.1}, "attention_dropout"),
])
def test_unsupported_settings_are_refused(change, match):
  d = {**I.to_hf_config(M.preset("llama-test")), **change}
  with pytest.raises(I.UnsupportedConfigError, match=match):
    I.config_from_hf(d)


def test_tied_checkpoint_with_a_different_head_is_refused():
  model = make(tie_word_embeddings=True)
  sd = {k: v.clone() for k, v in model.state_dict().items()}
  sd["lm_head.weight"] = sd["lm_head.weight"] + 1.0
  with pytest.raises(I.UnsupportedConfigError, match="lm_head.weight differs"):
    I.load_hf(sd, config=model.config, architecture="LlamaForCausalLM")


def test_init_from_a_checkpoint_with_another_rotary_base_is_refused(tmp_path):
  """Same parameter shapes, another function: ``initial_params`` refuses it (called with stand-ins that have just
  the fields it reads, so no run is set up)."""
  from types import SimpleNamespace

  from multilevel.cycles.transitions import initial_params
  cfg = M.preset("llama-test")
  I.save_hf(cfg.replace(rope_base=5e5), M.init_params(cfg, 0), tmp_path / "hf")
  run, plan = SimpleNamespace(init_from=str(tmp_path / "hf")), SimpleNamespace(levels=[cfg])
  with pytest.raises(ValueError, match=r"rope_base 500000.0 \(the config has 10000.0\)\. Run with "
                                       r"--config.model.rope_base=500000.0"):
    initial_params(run, plan, mesh=None)


# ------------------------------------------------------------------------------------------- Llama 3 rope scaling

# Head size 8 at base 500000: wavelengths 6.3, 167, 4.4e3 and 1.2e5 positions. With a pretraining context of 256
# (low 1, high 4) the first is kept (< 64), the second blended (64 .. 256), the last two divided by the factor.
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}
LLAMA3_OURS = dict(rope_scaling="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                   rope_original_max_len=256)


def llama3_model(tie=False):
  return make(tie_word_embeddings=tie, max_position_embeddings=512, rope_scaling=dict(LLAMA3))


@pytest.mark.parametrize("tie", [False, True])
def test_llama3_rope_scaling_imports_with_transformers_logits(tie):
  model = llama3_model(tie)
  cfg, params = I.load_hf(model)
  assert cfg == M.ModelConfig("llama", 2, 4, 8, ffn_size=48, vocab_size=64, max_len=512, num_kv_heads=2,
                              rope_base=5e5, tie_embeddings=tie, **LLAMA3_OURS)
  ref = hf_logits(model)
  plain = np.asarray(M.apply(cfg.replace(**{k: getattr(M.ModelConfig(), k) for k in LLAMA3_OURS}), params, TOKENS))
  assert np.abs(plain - ref).max() > 1e-2  # The rescaling changes the model at these positions.
  diff = np.abs(np.asarray(M.apply(cfg, params, TOKENS)) - ref).max()
  print(f"llama3 rope tie={tie}: max |logit diff| = {diff:.2e} (plain RoPE: {np.abs(plain - ref).max():.2e})")
  assert diff < TOL


def test_llama3_rope_scaling_reads_both_spellings():
  """transformers 5's ``rope_parameters`` (with ``rope_theta`` inside) and the ``rope_theta`` + ``rope_scaling`` of
  older ``config.json`` files (Llama 3.2's own) give the same config; a state dict imports with either."""
  model = llama3_model()
  d = {k: v for k, v in I.to_hf_config(I.config_from_hf(model.config)).items() if k not in ("rope_parameters",)}
  new = {**{k: v for k, v in d.items() if k not in ("rope_scaling", "rope_theta")},
         "rope_parameters": {**LLAMA3, "rope_theta": 5e5}}
  old = {**{k: v for k, v in d.items() if k != "rope_scaling"}, "rope_scaling": dict(LLAMA3)}
  assert I.config_from_hf(new) == I.config_from_hf(old) == I.config_from_hf(model.config)
  missing = {**old, "rope_scaling": {k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"}}
  assert I.config_from_hf(missing).rope_original_max_len == 512  # transformers' fallback: max_position_embeddings.
  cfg, params = I.load_hf(model.state_dict(), config=old, architecture="LlamaForCausalLM")
  assert np.abs(np.asarray(M.apply(cfg, params, TOKENS)) - hf_logits(model)).max() < TOL


def test_llama3_export_import_round_trip(tmp_path):
  """Our llama3 tree -> save_hf -> transformers: the same logits, and the config and tree back bit for bit."""
  cfg = M.preset("llama-test", max_len=512, **LLAMA3_OURS)
  params = jax.tree_util.tree_map(np.asarray, M.init_params(cfg, 5))
  params = jax.tree_util.tree_map(
      lambda x: x + 0.2 * np.random.default_rng(x.size).standard_normal(x.shape).astype(np.float32), params)
  out = I.save_hf(cfg, params, tmp_path / "ours")
  c2, p2 = I.load_hf(out)
  assert c2 == cfg
  assert_trees_equal(p2, params)
  c3, p3 = I.from_hf_state_dict(I.to_hf_state_dict(cfg, params), I.to_hf_config(cfg))
  assert c3 == cfg
  assert_trees_equal(p3, params)
  model = transformers.LlamaForCausalLM.from_pretrained(out).eval()
  assert model.config.rope_parameters["rope_type"] == "llama3"
  diff = np.abs(hf_logits(model) - np.asarray(M.apply(cfg, params, TOKENS))).max()
  print(f"llama3 rope exported: max |logit diff| = {diff:.2e}")
  assert diff < TOL
  c4, p4 = I.load_hf(model)
  assert c4 == cfg
  assert_trees_equal(p4, params)


@pytest.mark.parametrize("head_dim, base, scaling", [
    (8, 5e5, LLAMA3),
    (64, 5e5, {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}),  # Llama 3.2 1B.
    (128, 5e5, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}),  # Llama 3.1 8B.
    (32, 1e4, {"factor": 4.0, "low_freq_factor": 0.5, "high_freq_factor": 2.0,
               "original_max_position_embeddings": 100}),
])
def test_llama3_frequencies_and_tables_equal_transformers(head_dim, base, scaling):
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
  from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

  from multilevel.models.llama import llama3_scaling, rope_inverse_frequencies, rope_tables
  rope = {"rope_type": "llama3", "rope_theta": base, **scaling}
  hf = hf_config(hidden_size=4 * head_dim, head_dim=head_dim, max_position_embeddings=2 * 8192, rope_parameters=rope)
  cfg = I.config_from_hf(hf)
  theirs, attention_scaling = ROPE_INIT_FUNCTIONS["llama3"](hf, None)
  assert attention_scaling == 1.0
  ours = np.asarray(rope_inverse_frequencies(head_dim, cfg.rope_base, llama3_scaling(cfg)))
  plain = np.asarray(rope_inverse_frequencies(head_dim, cfg.rope_base))
  assert ours.dtype == np.float32 and np.any(ours != plain) and np.any(ours == plain)  # Kept and rescaled ones.
  np.testing.assert_allclose(ours, theirs.numpy(), rtol=3e-7, atol=0)
  length = 64
  cos, sin = rope_tables(length, head_dim, cfg.rope_base, llama3_scaling(cfg))
  with torch.no_grad():
    hf_cos, hf_sin = LlamaRotaryEmbedding(hf)(torch.zeros(1, dtype=torch.float32), torch.arange(length)[None])
  np.testing.assert_allclose(np.asarray(cos), hf_cos[0].numpy(), rtol=0, atol=2e-5)
  np.testing.assert_allclose(np.asarray(sin), hf_sin[0].numpy(), rtol=0, atol=2e-5)


@pytest.mark.parametrize("change, error, match", [
    ({"rope_scaling": {**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0}}, ValueError,
     "rope_high_freq_factor=1.0 must be greater than rope_low_freq_factor=4.0"),
    ({"rope_scaling": {**LLAMA3, "factor": 0.5}}, ValueError, "rope_factor must be a finite number >= 1"),
    ({"rope_scaling": {k: v for k, v in LLAMA3.items() if k != "factor"}}, I.UnsupportedConfigError,
     "of type 'llama3' has no factor"),
    ({"rope_scaling": dict(LLAMA3), "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
     I.UnsupportedConfigError, "disagree"),
    ({"rope_scaling": dict(LLAMA3), "rope_parameters": {**LLAMA3, "rope_theta": 1e4, "factor": 4.0}},
     I.UnsupportedConfigError, "disagree"),
    ({"rope_scaling": dict(LLAMA3), "original_max_position_embeddings": 128}, I.UnsupportedConfigError,
     "original_max_position_embeddings=128 at the top of the config but 256 in rope_scaling"),
])
def test_bad_llama3_rope_scaling_is_refused(change, error, match):
  d = {**{k: v for k, v in I.to_hf_config(M.preset("llama-test")).items() if k != "rope_parameters"}, **change}
  with pytest.raises(error, match=match):
    I.config_from_hf(d)


def test_init_from_a_checkpoint_with_llama3_rope_scaling_is_refused_by_a_plain_config(tmp_path):
  from types import SimpleNamespace

  from multilevel.cycles.transitions import initial_params
  cfg = M.preset("llama-test")
  I.save_hf(cfg.replace(**LLAMA3_OURS), M.init_params(cfg, 0), tmp_path / "hf")
  run, plan = SimpleNamespace(init_from=str(tmp_path / "hf")), SimpleNamespace(levels=[cfg])
  with pytest.raises(ValueError, match=r"rope_scaling 'llama3' \(the config has ''\).*"
                                        r"rope_original_max_len 256 \(the config has 8192\).*"
                                        r"--config.model.rope_scaling=llama3"):
    initial_params(run, plan, mesh=None)


def test_an_imported_llama_trains_at_a_shorter_max_len_and_keeps_its_context(tmp_path):
  """RoPE has no position parameters: a checkpoint declaring 512 positions initialises a run at max_len 16 once the
  config keeps the checkpoint's context (``context_len``, refused with the flag to paste otherwise), the logits are
  the checkpoint's, and the exported model declares 512 again (it declared the run's 16 before)."""
  from types import SimpleNamespace

  from multilevel.cycles.transitions import initial_params
  from multilevel.train import make_mesh
  model = make(max_position_embeddings=512)
  model.save_pretrained(tmp_path / "hf")
  short = M.preset("llama-test", max_len=16).replace(
      **{k: getattr(I.load_hf(model)[0], k) for k in ("rope_base", "num_kv_heads", "ffn_size", "vocab_size",
                                                      "num_heads", "head_dim", "num_layers")})
  run = SimpleNamespace(init_from=str(tmp_path / "hf"), train=SimpleNamespace(seed=0))
  with pytest.raises(ValueError, match=r"context_len 512 \(the config has 16\)\. Run with "
                                       r"--config.model.context_len=512\. The run trains at max_len=16"):
    initial_params(run, SimpleNamespace(levels=[short]), mesh=None)
  cfg = short.replace(context_len=512)
  params = initial_params(run, SimpleNamespace(levels=[cfg]), mesh=make_mesh("", 1))
  tokens = TOKENS[:, :8]
  assert np.abs(np.asarray(M.apply(cfg, params, tokens)) - hf_logits(model, tokens)).max() < TOL
  I.save_hf(cfg, jax.device_get(params), tmp_path / "out")
  back, _ = I.load_hf(str(tmp_path / "out"))
  assert transformers.AutoConfig.from_pretrained(tmp_path / "out").max_position_embeddings == 512
  assert back.max_len == 512 and back.context_len == 0
  with pytest.raises(ValueError, match="context_len must be >= 0"):
    cfg.replace(context_len=-1)
  with pytest.raises(ValueError, match="context_len=512 is a llama setting"):
    M.ModelConfig("gpt", context_len=512)
