"""Shared pieces of the engine tests: tiny configs of the real experiment files, and a subprocess runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, ".cache", "test-data")  # Tokenizers trained once, shared by every test process.


def tiny_config(family: str, levels: int = 2, deep: bool = False, **overrides):
  """The real ``experiments/configs/<family>.py:test`` config, optionally 4 layers x 4 heads (for 3 levels)."""
  from experiments.configs import bert, deit, gpt, llama
  from experiments.configs.common import override
  c = {"bert": bert, "gpt": gpt, "deit": deit, "llama": llama}[family].get_config("test")
  c.unlock()
  c.cycle.levels = levels
  c.progress = False
  c.tensorboard = False
  c.data.cache_dir = CACHE
  # A loop over the layers: on the CPU the default unrolls them (a faster step, a slower compile), and these runs
  # are mostly compilation. The unrolled model is the same model (tests/test_models.py).
  c.model.scan_unroll = 1
  if deep:
    c.model.num_layers, c.model.num_heads, c.model.head_dim = 4, 4, 8
  return override(c, overrides)


def config_flags(family: str, levels: int, deep: bool, overrides: dict) -> list[str]:
  out = [f"--config={os.path.join(ROOT, 'experiments', 'configs', family + '.py')}:test",
         f"--config.cycle.levels={levels}", "--config.progress=False", "--config.tensorboard=False",
         f"--config.data.cache_dir={CACHE}", f"--compilation_cache={os.path.join(ROOT, '.cache', 'jax-tests')}",
         "--config.model.scan_unroll=1"]  # As tiny_config.
  if deep:
    out += ["--config.model.num_layers=4", "--config.model.num_heads=4", "--config.model.head_dim=8"]
  out += [f"--config.{k}={v}" for k, v in overrides.items()]
  return out


# Prefix for a child that must see Ctrl-C: a shell without job control (``cmd &`` in a script, as some CI harnesses
# run) starts its background jobs with SIGINT ignored, a child inherits that, and Python then installs no
# KeyboardInterrupt handler, so the tests' SIGINT would do nothing. This resets SIGINT and execs the real command
# (rather than a preexec_fn, which forks a multithreaded process).
SIGINT_DEFAULT = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"]


def run_cli(workdir: str, flags: list[str], env: dict | None = None, timeout: float = 300):
  """Runs ``python -m experiments.train`` in a subprocess; returns the CompletedProcess."""
  env = dict(env or {})
  if "XLA_FLAGS" in env:  # Added to the test session's flags, not instead of them.
    env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {env['XLA_FLAGS']}".strip()
  full_env = dict(os.environ, JAX_PLATFORMS="cpu", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", **env)
  return subprocess.run([*SIGINT_DEFAULT, "-m", "experiments.train", f"--workdir={workdir}", *flags], cwd=ROOT,
                        env=full_env, capture_output=True, text=True, timeout=timeout)


def run_cmd(args: list[str], timeout: float = 300):
  """Runs a command (e.g. ``[sys.executable, '-m', 'experiments.plan', ...]``) from the repository root on the CPU;
  returns the CompletedProcess, its output captured as text."""
  return subprocess.run(args, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                        timeout=timeout)


def read_jsonl(path: str) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(ln) for ln in f if ln.strip()]


class Killed(Exception):
  """Raised by ``train_killed_at``'s fault hook where a crash would kill the process."""


def train_killed_at(config, workdir, fault=None, monkeypatch=None) -> dict:
  """Runs ``config`` in this process through the driver; with ``fault`` (a ``MULTILEVEL_FAULT`` point such as
  ``step:7`` or ``transition:1``) the run raises ``Killed`` there instead, as a crash would stop it (the hook is set
  with ``monkeypatch``; undo it before the resuming run)."""
  from multilevel.cycles import driver as D
  if fault is not None:
    def hook(point):
      if point == fault:
        raise Killed(point)
    monkeypatch.setattr(D, "_fault", hook)
  return D.train_and_evaluate(config, str(workdir))
