"""The LLaMA-style family: the model (GQA, RoPE, SwiGLU, RMSNorm), its axis-role table, its presets, and the
operators on it (grouped-query schemes, function-preserving width and depth growth, bit-exact round trips, refusals).

Everything runs on ``llama-test`` shapes (4 heads of 8 sharing 2 key/value heads, FFN 48) with a few compiled
functions shared by the tests; big presets are only shape-evaluated.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multilevel import models as M
from multilevel import operators as O
from multilevel.models import axes as A
from multilevel.models import parts
from multilevel.tree import flatten
from tests.operator_util import assert_like_config, assert_tree_equal, random_params, round_trip_c

CFG = M.preset("llama-test")
BIG = M.preset("llama-test", num_layers=4)  # The large model of the operator tests.
apply_jit = jax.jit(M.apply, static_argnums=0)


def tokens(cfg, batch=2, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, (batch, cfg.max_len)), jnp.int32)


@functools.cache
def params_of(cfg, std=0.3, seed=0):
  return random_params(cfg, seed=seed, std=std)


def logits(cfg, p):
  return np.asarray(apply_jit(cfg, p, tokens(cfg)))


# ---------------------------------------------------------------------------------------------------------- model

# Hugging Face's parameter counts (LlamaForCausalLM with the tied head counted once).
HF_COUNTS = {"smollm-135m": 134_515_008, "llama-3.2-1b": 1_235_814_400}


@pytest.mark.parametrize("name", sorted(HF_COUNTS))
def test_preset_parameter_counts_equal_hugging_face(name):
  cfg = M.preset(name)
  params = M.abstract_params(cfg)  # Shapes only.
  assert M.num_params(params) == HF_COUNTS[name]
  assert "lm_head" not in params  # Both tie the head to the embedding.
  assert params["layers"]["attn"]["key"]["kernel"].shape == (cfg.num_layers, cfg.width, cfg.num_kv_heads, 64)


def test_forward_is_causal_and_finite():
  p = params_of(CFG)
  x = tokens(CFG, batch=1)
  a = logits(CFG, p)[:1]
  assert a.shape == (1, CFG.max_len, CFG.vocab_size) and np.all(np.isfinite(a))
  t = 9
  b = np.asarray(apply_jit(CFG, p, x.at[0, t].set((x[0, t] + 1) % CFG.vocab_size)))
  np.testing.assert_array_equal(a[:, :t], b[:, :t])
  assert np.all(np.max(np.abs(a[:, t:] - b[:, t:]), axis=-1) > 1e-6)


def test_grouped_query_attention_reads_key_value_head_n_over_r():
  """GQA equals multi-head attention whose key/value heads are the GQA ones repeated r times in a row (HF's
  ``repeat_kv``): query head n reads key/value head n // r."""
  mha = CFG.replace(num_kv_heads=0)
  p = params_of(CFG)
  q = jax.tree.map(lambda x: x, p)
  for k in ("key", "value"):
    q["layers"]["attn"][k]["kernel"] = jnp.repeat(p["layers"]["attn"][k]["kernel"], 2, axis=2)
  np.testing.assert_allclose(logits(mha, q), logits(CFG, p), rtol=0, atol=2e-5)


def test_untied_and_tied_heads():
  tied = CFG.replace(tie_embeddings=True)
  p = M.abstract_params(tied)
  assert "lm_head" not in p and "lm_head" in M.abstract_params(CFG)
  assert M.FAMILY["llama"].ties(tied) and not M.FAMILY["llama"].ties(CFG)


def test_a_model_run_in_parts_computes_the_whole_model():
  """Through ``Family.blocks`` (LLaMA's own blocks with their rotary tables); frozen parts are the generic code,
  tested on GPT in test_models.py."""
  p = params_of(CFG)
  x = tokens(CFG)
  cut = jax.tree.map(lambda a: (a[:1], a[1:]), p["layers"])
  slices = [jax.tree.map(lambda t: t[i], cut, is_leaf=lambda t: isinstance(t, tuple)) for i in range(2)]
  split = jax.jit(lambda s: parts.apply_in_parts(CFG, parts.outer(p), s, x))(slices)
  np.testing.assert_allclose(split, logits(CFG, p), rtol=0, atol=1e-5)


# Sizes that are all different, so an axis with the wrong role cannot match by accident.
ODD = M.ModelConfig("llama", 3, 6, 4, num_kv_heads=2, ffn_size=18, vocab_size=11, max_len=13)


@pytest.mark.parametrize("tie", [False, True])
def test_every_parameter_has_axis_roles_of_the_right_size(tie):
  cfg = ODD.replace(tie_embeddings=tie)
  table = M.FAMILY["llama"].axes
  size = {"hidden": cfg.width, "heads": cfg.num_heads, "kv": cfg.num_kv_heads, "ffn": cfg.ffn_dim}
  params = flatten(M.abstract_params(cfg))
  for name, leaf in params.items():
    roles = table[name]
    assert len(roles) == leaf.ndim and (roles[0] == A.LAYERS) == name.startswith("layers/"), name
    for n, role in zip(leaf.shape, roles):
      assert role is None or role in A.ROLES, (name, role)
      want = cfg.num_layers if role == A.LAYERS else size[role.split(":")[0]] if role else None
      assert role is None and n not in size.values() or n == want, (name, role, leaf.shape)
  assert set(table) - set(params) == ({"lm_head/kernel"} if tie else set())


def test_config_validation():
  with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=4"):
    CFG.replace(num_kv_heads=3)
  with pytest.raises(ValueError, match="head_dim must be even"):
    CFG.replace(head_dim=7)
  with pytest.raises(ValueError, match="num_kv_heads=2 is a llama setting"):
    M.ModelConfig("gpt", num_kv_heads=2)
  with pytest.raises(ValueError, match="rope_base must be > 1"):
    CFG.replace(rope_base=1.0)
  assert CFG.eps == 1e-5 and CFG.ffn_dim == 48 and CFG.kv_heads == 2


LLAMA3 = dict(rope_scaling="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
              rope_original_max_len=64)


def test_llama3_rope_scaling_validation():
  with pytest.raises(ValueError, match="rope_scaling must be '' \\(plain RoPE\\) or 'llama3'.*yarn"):
    CFG.replace(rope_scaling="yarn")
  with pytest.raises(ValueError, match="rope_factor=32.0: read only with rope_scaling='llama3'"):
    CFG.replace(rope_factor=32.0)
  l3 = CFG.replace(**LLAMA3)
  with pytest.raises(ValueError, match="rope_factor must be a finite number >= 1"):
    l3.replace(rope_factor=0.5)
  with pytest.raises(ValueError, match="rope_low_freq_factor must be a finite number > 0"):
    l3.replace(rope_low_freq_factor=0.0)
  with pytest.raises(ValueError, match="rope_high_freq_factor=4.0 must be greater than rope_low_freq_factor=4.0"):
    l3.replace(rope_low_freq_factor=4.0)
  with pytest.raises(ValueError, match="rope_original_max_len must be a positive integer"):
    l3.replace(rope_original_max_len=0)
  with pytest.raises(ValueError, match="rope_scaling='llama3' is a llama setting"):
    M.ModelConfig("gpt", rope_scaling="llama3")
  from multilevel.models.llama import llama3_scaling
  preset = M.preset("llama-3.2-1b")  # Llama 3.2 1B's config.json.
  assert (preset.rope_base, llama3_scaling(preset)) == (5e5, (32.0, 1.0, 4.0, 8192))


def test_llama3_frequencies_are_kept_blended_or_divided():
  """Against the definition, in float64: wavelengths below original / high keep their frequency, above original / low
  it is divided by the factor, in between blended; the plain frequencies are what they always were."""
  from multilevel.models.llama import rope_inverse_frequencies
  head_dim, base = 32, 1e4
  plain = 1.0 / (base ** (np.arange(0, head_dim, 2) / head_dim))
  np.testing.assert_array_equal(
      rope_inverse_frequencies(head_dim, base),
      1.0 / (base ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)))
  factor, low, high, original = 8.0, 1.0, 4.0, 64
  wave = 2 * np.pi / plain
  s = (original / wave - low) / (high - low)
  want = np.where(wave < original / high, plain,
                  np.where(wave > original / low, plain / factor, (1 - s) * plain / factor + s * plain))
  kinds = (wave < original / high).sum(), (wave > original / low).sum()
  assert min(kinds) > 0 and sum(kinds) < len(wave)  # Some of each.
  np.testing.assert_allclose(rope_inverse_frequencies(head_dim, base, (factor, low, high, original)), want, rtol=1e-6)


def test_llama3_rope_scaling_changes_the_model_and_growth_keeps_it():
  l3 = CFG.replace(**LLAMA3)
  p = params_of(CFG)
  assert np.max(np.abs(logits(l3, p) - logits(CFG, p))) > 1e-3
  m = O.make_mapping(BIG.replace(**LLAMA3))
  assert all(getattr(m.small, k) == v for k, v in LLAMA3.items())


# ------------------------------------------------------------------------------------------------------ operators

HOW = {"width": dict(depth_factor=1), "depth": dict(width_factor=1), "both": {}}


@functools.cache
def grown(tie, how, depth_growth="zero", preln_exact=False, eps=-1.0):
  m = O.make_mapping(BIG.replace(tie_embeddings=tie, ln_eps=eps), depth_growth=depth_growth,
                     preln_exact=preln_exact, **HOW[how])
  small = params_of(m.small, seed=1)
  big, back = round_trip_c(small, m)  # Compiled once per mapping: far cheaper than eager operators on new shapes.
  return m, small, big, back


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("how", sorted(HOW))
def test_coalesce_after_decoalesce_is_bit_exact(tie, how):
  m, small, big, back = grown(tie, how)
  assert_like_config(big, m.large)
  assert_tree_equal(back, small)


def test_gqa_schemes_follow_the_query_heads():
  m = O.make_mapping(BIG)  # Heads (0, 2) and (1, 3): every small head reads both large key/value heads.
  assert m.heads == ((0, 2), (1, 3)) and m.kv_heads == ((0, 1),)
  assert (m.small.num_heads, m.small.num_kv_heads, m.small.ffn_dim) == (2, 1, 24)
  m = O.make_mapping(BIG, width=[[0, 1], [2, 3]])  # Each key/value group merged into one head: MHA with 2 heads.
  assert m.kv_heads == ((0,), (1,)) and (m.small.num_heads, m.small.num_kv_heads) == (2, 2)
  eight = BIG.replace(num_heads=8, num_kv_heads=4, ffn_size=64)
  m = O.make_mapping(eight)  # Heads i and i+4, key/value heads j and j+2: the ratio (2) is kept.
  assert m.kv_heads == ((0, 2), (1, 3)) and (m.small.num_heads, m.small.num_kv_heads) == (4, 2)
  mqa = O.make_mapping(BIG.replace(num_kv_heads=1))
  assert mqa.kv_heads == ((0,),) and mqa.small.num_kv_heads == 1
  mha = O.make_mapping(BIG.replace(num_kv_heads=0))
  assert mha.kv_heads == () and mha.small.num_kv_heads == 0 and mha.kv_map is mha.head_map


def test_gqa_round_trip_and_growth_with_the_ratio_kept():
  """Eight heads on four key/value heads halve to four on two: growth is exact and comes back bit for bit."""
  m = O.make_mapping(BIG.replace(num_heads=8, num_kv_heads=4, ffn_size=64, num_layers=2), depth_factor=1)
  small = params_of(m.small, seed=2, std=0.05)
  big, back = round_trip_c(small, m)
  assert_tree_equal(back, small)
  np.testing.assert_allclose(logits(m.large, big), logits(m.small, small), rtol=0, atol=1e-5)


# Width growth through RMSNorm, SwiGLU and GQA (untied): the residual stream of the grown model is the small one's
# with every channel duplicated (the embedding is copied), RMS(Q x) = RMS(x) for equal groups, gate and up copy their
# units together so silu(gate) * up is duplicated and down divides by the multiplicity, and each duplicated query
# head reads a duplicate of its key/value head. So the growth is exact (fp32 rounding only, any epsilon).
def test_untied_width_growth_keeps_the_function_exactly_at_the_default_epsilon():
  m, small, big, _ = grown(False, "width")
  a, b = logits(m.small, small), logits(m.large, big)
  assert np.max(np.abs(a)) > 1.0
  np.testing.assert_allclose(b, a, rtol=0, atol=2e-5)


@pytest.mark.parametrize("tie", [False, True])
def test_zero_depth_growth_with_width_growth_keeps_the_function(tie):
  m, small, big, _ = grown(tie, "both", preln_exact=tie, eps=1e-12 if tie else -1.0)
  np.testing.assert_allclose(logits(m.large, big), logits(m.small, small), rtol=0, atol=2e-5)


def test_tied_width_growth_is_exact_up_to_the_epsilon_with_preln_exact():
  """Tied, the embedding is halved on growth (it is the head too), so the stream is Q x / 2: with ``preln_exact``
  every branch output is halved as well, and RMSNorm(x / 2; eps) = RMSNorm(x; 4 eps). Exact with a tiny epsilon;
  at LLaMA's 1e-5 off by about 1e-2 on these weights; without ``preln_exact`` not function-preserving at all."""
  m, small, big, _ = grown(True, "width", preln_exact=True, eps=1e-12)
  np.testing.assert_allclose(logits(m.large, big), logits(m.small, small), rtol=0, atol=2e-5)
  m, small, big, _ = grown(True, "width", preln_exact=True)
  err = np.max(np.abs(logits(m.large, big) - logits(m.small, small)))
  assert 1e-4 < err < 5e-2, err
  m, small, big, _ = grown(True, "width")
  assert np.max(np.abs(logits(m.large, big) - logits(m.small, small))) > 0.5


def test_split_noise_keeps_the_grown_function():
  m, small, big, _ = grown(False, "width")
  noise = functools.partial(O.split_noise, scale=0.2, seed=0, check_finite=False)
  noisy = jax.jit(noise, static_argnums=1, compiler_options={"xla_backend_optimization_level": 0})(big, m)
  assert not np.array_equal(noisy["layers"]["attn"]["key"]["kernel"], big["layers"]["attn"]["key"]["kernel"])
  np.testing.assert_allclose(logits(m.large, noisy), logits(m.small, small), rtol=0, atol=5e-5)


def test_fsdp_splits_llama_by_its_roles():
  from jax.sharding import AbstractMesh, PartitionSpec as P

  from multilevel.train.sharding import param_specs
  specs = param_specs(M.preset("llama-3.2-1b"), AbstractMesh((2, 4), ("data", "fsdp")))
  assert specs["embed/embedding"] == P(None, "fsdp")  # The hidden axis, never the vocabulary.
  assert specs["layers/attn/key/kernel"] == P(None, "fsdp", None, None)
  assert specs["layers/mlp/down/kernel"] == P(None, None, "fsdp")  # Hidden-like axes first, as in every family.
  assert all(spec[0] is None for name, spec in specs.items() if name.startswith("layers/"))


def test_bad_schemes_are_refused():
  with pytest.raises(ValueError, match="splits a grouped-query-attention group"):
    O.make_mapping(BIG, width=[[0], [2], [1], [3]])
  eight = BIG.replace(num_heads=8, num_kv_heads=4, ffn_size=64)
  with pytest.raises(ValueError, match="num_kv_heads would not divide num_heads=4"):
    O.make_mapping(eight, width=[[0, 1], [2, 3], [4, 6], [5, 7]])
  with pytest.raises(ValueError, match="FFN width 50 is not a multiple of num_heads=4"):
    O.make_mapping(BIG.replace(ffn_size=50))
  with pytest.raises(ValueError, match="index 4, out of range"):  # The checks of every family still apply.
    O.make_mapping(BIG, width=[[0, 4], [1, 2]])
  with pytest.raises(ValueError, match="different numbers of large heads"):
    O.make_mapping(BIG, width=[[0, 1, 2], [3]])
  with pytest.raises(ValueError, match="the tree to coalesce"):
    O.coalesce(params_of(CFG), O.make_mapping(BIG))


# -------------------------------------------------------------------------------------------------------- training

def test_analytic_flops_match_xla_within_10_percent():
  """One layer, so XLA's cost analysis (which counts a loop body once) sees every matmul exactly once."""
  from multilevel.train.flops import train_flops_per_step
  from multilevel.train.objectives import ObjectiveConfig
  from multilevel.train.optim import LrSchedule, OptimConfig
  from multilevel.train.step import StepConfig, TrainState, train_step_fn
  cfg = M.ModelConfig("llama", 1, 4, 32, num_kv_heads=2, ffn_size=256, vocab_size=512, max_len=64)
  params = M.abstract_params(cfg)
  tx = OptimConfig(LrSchedule(1e-3, 10)).build()
  step = jax.jit(train_step_fn(StepConfig(cfg, ObjectiveConfig()), tx))
  batch = {"tokens": jax.ShapeDtypeStruct((8, 64), jnp.int32)}
  state = TrainState(params, jax.eval_shape(tx.init, params))
  cost = step.lower(state, batch, jax.ShapeDtypeStruct((), jnp.int32)).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  assert cost["flops"] == pytest.approx(train_flops_per_step(cfg, 8), rel=0.10)


@pytest.mark.slow
def test_vcycle_trains_and_growth_keeps_the_loss(tmp_path):
  """The real driver on ``experiments/configs/llama.py:test``: down, train the small model, grow back (width and
  zero depth growth, no interpolation, split noise); the grown model evaluates like the small one."""
  import math

  from multilevel.cycles.driver import train_and_evaluate
  from tests.engine_util import read_jsonl, tiny_config
  c = tiny_config("llama", levels=2, **{"cycle.w_pre": 0.0, "cycle.split_noise": 0.1, "train.steps": 24})
  s = train_and_evaluate(c, str(tmp_path))
  assert math.isfinite(s["final_eval_loss"])
  recs = read_jsonl(str(tmp_path / "metrics.jsonl"))
  small_end = [r for r in recs if r.get("event") == "end_of_stage" and r["level"] == 1][-1]["eval_loss"]
  grown = next(r for r in recs if r.get("event") == "after_decoalesce")["eval_loss"]
  assert grown == pytest.approx(small_end, abs=1e-4)


def test_depth_only_coalescing_takes_any_ffn_width():
  # SmolLM-135M's shape: FFN 1536 over 9 heads. Width coalescing needs the FFN in head-sized chunks; depth alone not.
  cfg = M.preset("smollm-135m").replace(num_layers=4, vocab_size=128, max_len=16)
  m = O.make_mapping(cfg, width_factor=1, depth_growth="zero")
  assert (m.small.num_layers, m.small.num_heads, m.small.ffn_dim) == (2, 9, 1536)
  small = O.coalesce(M.init_params(cfg, 0), m)
  grown = O.decoalesce(small, m)
  jax.tree.map(np.testing.assert_array_equal, O.coalesce(grown, m), small)
  x = np.random.default_rng(0).integers(0, 128, (2, 8))
  np.testing.assert_allclose(M.apply(m.large, grown, x), M.apply(m.small, small, x), rtol=0, atol=1e-5)
  with pytest.raises(ValueError, match="or keep the width"):
    O.make_mapping(cfg, width=[[0, 1, 2], [3, 4, 5], [6, 7, 8]], allow_unequal_width_groups=True)
