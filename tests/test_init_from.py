"""Starting a run from a Hugging Face checkpoint (config.init_from), and the config protocols."""

import dataclasses

import jax
import numpy as np
import pytest

from experiments.configs import bert, deit, gpt
from multilevel.cycles.driver import Runner
from multilevel.cycles.transitions import initial_params
from multilevel.interop import save_hf
from tests.engine_util import tiny_config


@pytest.fixture(scope="module")
def runner_and_dir(tmp_path_factory):
  base = tmp_path_factory.mktemp("init")
  runner = Runner(tiny_config("gpt", levels=1), str(base / "probe"))
  yield runner, base
  runner.close()


def test_init_from_loads_the_checkpoint_exactly(runner_and_dir):
  runner, base = runner_and_dir
  target = runner.plan.levels[0]
  params = jax.tree.map(lambda x: x + 0.01, initial_params(runner.config, runner.plan, runner.mesh))  # Not random.
  save_hf(target, params, str(base / "hf"))
  loaded = initial_params(dataclasses.replace(runner.config, init_from=str(base / "hf")), runner.plan, runner.mesh)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_init_from_a_checkpoint_of_another_shape_is_refused(runner_and_dir):
  runner, base = runner_and_dir
  target = runner.plan.levels[0]
  other = target.replace(num_layers=3, ln_eps=1e-6, vocab_size=target.vocab_size + 8)
  from multilevel import models as M
  save_hf(other, M.init_params(other, 0), str(base / "other"))
  run = dataclasses.replace(runner.config, init_from=str(base / "other"))
  # Every difference at once, as flags to paste (it named one parameter's shape at a time, and never the epsilon).
  with pytest.raises(ValueError, match=rf"is a gpt model with other settings than the model config: num_layers 3 "
                                       rf"\(the config has {target.num_layers}\), vocab_size {other.vocab_size} .*"
                                       rf"ln_eps 1e-06 \(the config has 1e-05\)\. Run with --config.model.num_layers=3 "
                                       rf"--config.model.vocab_size={other.vocab_size} --config.model.ln_eps=1e-06 "
                                       rf"\(and data.tokenizer set to the checkpoint's tokenizer\)"):
    initial_params(run, runner.plan, runner.mesh)


@pytest.mark.parametrize("module", [gpt, bert, deit])
def test_reference_protocol_restores_the_paper_settings(module):
  c = module.get_config("test,reference")
  assert (c.cycle.transition_warmup_frac, c.cycle.depth_growth, c.cycle.preln_exact) == (0.0, "copy", False)
  assert module.get_config("test").cycle.transition_warmup_frac == (0.0 if module is bert else 0.05)


def test_unknown_protocol_or_size_is_refused():
  with pytest.raises(ValueError, match="Unknown protocol"):
    gpt.get_config("test,fast")
  with pytest.raises(ValueError, match="Unknown gpt size"):
    gpt.get_config("huge")


def test_the_runner_has_what_transitions_and_resume_declare_they_need(runner_and_dir):
  """transitions.Host and resume.Host name what those modules read off the driver's Runner (so that they need not
  import the driver): a renamed Runner attribute or method fails here, not in the middle of a run."""
  from multilevel.cycles import resume, transitions
  runner, _ = runner_and_dir
  for host in (transitions.Host, resume.Host):
    names = set(host.__annotations__) | {n for n, v in vars(host).items() if callable(v) and not n.startswith("_")}
    assert {"plan", "steps_for"} <= names
    assert [n for n in sorted(names) if not hasattr(runner, n)] == [], host


def test_a_text_run_from_a_checkpoint_reads_its_tokenizer(tmp_path, monkeypatch):
  from absl import logging
  from multilevel import models as M
  from multilevel.cycles.run_config import data_config as _data_for
  from multilevel.cycles.run_config import RunConfig
  run = RunConfig.from_config(tiny_config("gpt", levels=1))
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "model.safetensors").write_bytes(b"")
  warned = []
  monkeypatch.setattr(logging, "warning", lambda fmt, *a: warned.append(fmt % a))
  data = _data_for(dataclasses.replace(run, init_from=str(hf)), M.family_of("gpt"))
  assert data.tokenizer == "" and "holds no tokenizer.json" in warned[0]  # It trains its own, and says so.
  (hf / "tokenizer.json").write_text("{}")
  for source in (hf, hf / "model.safetensors"):  # A folder, or a file in it.
    assert _data_for(dataclasses.replace(run, init_from=str(source)), M.family_of("gpt")).tokenizer == str(
        hf / "tokenizer.json")
  given = dataclasses.replace(run, init_from=str(hf), data=dataclasses.replace(run.data, tokenizer="mine.json"))
  assert _data_for(given, M.family_of("gpt")).tokenizer == "mine.json"  # One the user names wins.
  assert _data_for(run, M.family_of("gpt")).tokenizer == ""  # No checkpoint: as before.


def test_each_familys_settings_are_compared_as_the_model_uses_them():
  from multilevel import models as M
  from multilevel.cycles.transitions import checkpoint_differs
  llama = M.preset("llama-test")
  assert checkpoint_differs(llama.replace(num_kv_heads=llama.num_heads), llama.replace(num_kv_heads=0)) == {}
  assert checkpoint_differs(llama.replace(num_kv_heads=1), llama)["num_kv_heads"] == (1, llama.kv_heads)
  assert checkpoint_differs(llama.replace(ln_eps=llama.eps), llama.replace(ln_eps=-1)) == {}  # -1: the default.
  gpt = M.preset("gpt-test")
  wide = gpt.replace(num_heads=gpt.num_heads * 2, ffn_ratio=2)  # Its FFN is as wide as the checkpoint's, by chance.
  assert checkpoint_differs(gpt, wide) == {"num_heads": (gpt.num_heads, wide.num_heads),
                                           "ffn_size": (gpt.ffn_dim, 2 * gpt.width)}  # At the corrected width.
  assert "num_kv_heads" not in checkpoint_differs(gpt, gpt.replace(num_heads=gpt.num_heads * 2))  # Not a GPT key.
  fixed = wide.replace(**{k: a for k, (a, _) in checkpoint_differs(gpt, wide).items()})
  assert checkpoint_differs(gpt, fixed) == {}  # The suggested flags make the config the checkpoint's.
  deit = M.preset("deit-test")
  other = deit.replace(num_classes=deit.num_classes + 3, image_size=deit.image_size * 2)
  assert set(checkpoint_differs(other, deit)) == {"num_classes", "image_size"}
  assert checkpoint_differs(M.preset("gpt-test"), deit) == {"family": ("gpt", "deit")}


def test_a_run_from_a_checkpoint_evaluates_it_before_any_step(tmp_path):
  """The imported model's loss is logged at step 0 (event 'imported'): a run's exported model, imported again,
  scores what the run ended with."""
  from multilevel.checkpoint import load_run
  from multilevel.cycles.driver import train_and_evaluate
  from multilevel.metrics import read_metrics
  first = train_and_evaluate(tiny_config("gpt", levels=1, **{"train.steps": 8}), str(tmp_path / "a"))
  save_hf(*load_run(str(tmp_path / "a")), str(tmp_path / "hf"))
  train_and_evaluate(tiny_config("gpt", levels=1, **{"train.steps": 4, "init_from": str(tmp_path / "hf")}),
                     str(tmp_path / "b"))
  rec = read_metrics(str(tmp_path / "b"))[0]
  assert (rec["step"], rec["event"]) == (0, "imported")
  assert rec["eval_loss"] == pytest.approx(first["final_eval_loss"], abs=1e-5)


def test_init_from_into_a_relaxed_first_stage_says_it_starts_from_that_form(runner_and_dir, monkeypatch):
  from absl import logging

  from multilevel.cycles.driver import train_and_evaluate
  runner, base = runner_and_dir
  target = runner.plan.levels[0]
  save_hf(target, initial_params(runner.config, runner.plan, runner.mesh), str(base / "for_core"))
  warned = []
  monkeypatch.setattr(logging, "warning", lambda msg, *a: warned.append(msg % a))
  c = tiny_config("gpt", levels=1, init_from=str(base / "for_core"),
                  **{"cycle.method": "core", "cycle.core.chunk": 8, "train.steps": 4})
  train_and_evaluate(c, str(base / "core_run"))  # CoRe cuts the imported FFNs to low rank, attention made linear.
  assert any("trains the imported model as relaxed(rank=" in w for w in warned), warned
