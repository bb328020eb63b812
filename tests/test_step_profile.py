"""benchmarks/step_profile.py: a step's XLA operations given to their part (by name scope) and kind, and a real
traced step split that way."""

import jax
import pytest
import jax.numpy as jnp

from benchmarks import step_profile as SP


def test_operations_are_given_to_their_name_scope_and_to_matmul_or_other():
  def f(w, x, labels):
    with jax.named_scope("layers"):
      h = jnp.tanh(x @ w)
    with jax.named_scope("vocab_loss"):
      loss = jnp.sum((h @ w.T - labels) ** 2)
    with jax.named_scope("optimizer"):
      w2 = w * 0.9 + 0.1
    return loss, w2, jnp.exp(x).sum()

  args = (jnp.ones((8, 8)), jnp.ones((4, 8)), jnp.ones((4, 8)))
  ops = SP.classify_hlo(jax.jit(f).lower(*args).compile().as_text())
  got = set(ops.values())
  assert ("blocks", "matmul") in got
  assert ("vocab_loss", "matmul") in got
  assert ("optimizer", "other") in got
  assert ("rest", "other") in got  # The exp outside every scope.
  assert ("optimizer", "matmul") not in got and ("rest", "matmul") not in got


def test_part_of_reads_the_scopes_of_an_op_name():
  assert SP.part_of("jit(step)/jvp(Gpt)/layers/attn/dot_general") == "blocks"
  assert SP.part_of("jit(step)/transpose(jvp(Gpt))/vocab_loss/while/body/dot_general") == "vocab_loss"
  assert SP.part_of("jit(step)/optimizer/mul") == "optimizer"
  assert SP.part_of("jit(step)/jvp(Gpt)/ln_final/mul") == "rest"
  assert SP.part_of("jit(step)/jvp(Gpt)/my_layers_x/mul") == "rest"  # Only a whole scope named layers.


def test_a_real_train_step_is_traced_and_split_by_part():
  from benchmarks import step_ratio
  from multilevel import models as M
  cfg = M.ModelConfig("gpt", 2, 2, 8, vocab_size=64, max_len=16, scan_unroll=1)
  timed = step_ratio.Timed(cfg, 4)
  timed.run(1)
  ops = SP.classify_hlo(timed.train.as_text())
  # The engine's step names its loss head and optimizer update (losses.py, step.py) and the model its blocks.
  assert {("blocks", "matmul"), ("vocab_loss", "matmul"), ("optimizer", "other")} <= set(ops.values())
  out = SP.profile_side(timed, 2)
  ms = out["ms"]
  assert ms["blocks"]["matmul"] > 0 and ms["vocab_loss"]["matmul"] > 0 and ms["optimizer"]["other"] > 0
  total = sum(v for part in ms.values() for v in part.values())
  assert abs(total - out["op_ms"]) < 1e-6
  assert out["unmatched_ms"] <= 0.1 * out["op_ms"] and out["matched_events"] > 0
  assert out["wall_ms"] > 0


def test_an_executable_without_the_engines_scopes_is_refused_before_tracing():
  # What a persistent cache hands back for a step compiled before the engine named its parts: no optimizer scope.
  text = jax.jit(lambda w, x: jnp.sum(jnp.tanh(x @ w))).lower(jnp.ones((8, 8)), jnp.ones((4, 8))).compile().as_text()
  ran = []
  with pytest.raises(ValueError, match="names no 'optimizer' scope.*JAX_COMPILATION_CACHE_DIR"):
    SP.traced(lambda: ran.append(1), text, 1)
  assert not ran


def test_two_breakdowns_compare_part_by_part():
  zero = {kind: 0.0 for kind in SP.KINDS}
  big = {"ms": {**{p: dict(zero) for p in SP.PARTS}, "blocks": {"matmul": 8.0, "other": 4.0}}}
  small = {"ms": {**{p: dict(zero) for p in SP.PARTS}, "blocks": {"matmul": 2.0, "other": 2.0}}}
  parts = SP.compare_parts(big, small)
  assert parts["blocks"] == {"big_ms": 12.0, "small_ms": 4.0, "time_ratio": 4.0 / 12.0, "matmul_time_ratio": 0.25,
                             "other_time_ratio": 0.5}
  assert parts["optimizer"]["big_ms"] == 0.0 and parts["optimizer"]["time_ratio"] != parts["optimizer"]["time_ratio"]


@pytest.mark.parametrize("argv,match", [
    (["--families=gpt,lama"], "unknown lama.*gpt, bert, deit"),
    (["--families=,"], "none given"),
    (["--steps=0"], "--steps must be 1 or more"),
])
def test_bad_flags_are_refused_before_anything_runs(argv, match):
  from absl import app
  with pytest.raises(app.UsageError, match=match):
    SP.checked_families(SP.parse_args(argv))
  assert SP.checked_families(SP.parse_args(["--families=deit, gpt"])) == ["deit", "gpt"]
