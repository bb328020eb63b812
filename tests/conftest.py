"""Shared pytest setup: the repository importable without installing it, nothing on the network, JAX on the CPU with
strict rank promotion, and one persistent compilation cache for the command-line subprocesses of the whole run (they
compile the same tiny steps; later ones load them instead of compiling again)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# Nothing touches the network at test time: every Hugging Face library stays offline, JAX stays on the CPU.
for _var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
  os.environ.setdefault(_var, "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
COMPILE_CACHE = os.path.join(ROOT, ".cache", "jax-tests")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", COMPILE_CACHE)  # Read by the subprocesses too.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The tests' steps are tiny and compiled many times: XLA's cheapest CPU code generation compiles them about a third
# faster (the results of a test are compared with runs under the same flags; users' runs keep XLA's defaults).
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")  # Implicit broadcasting of ranks is a bug here.
# The persistent cache serves the command-line subprocesses (the environment above); the pytest processes keep their
# compiled steps in memory. Writing them to the cache too crashed a worker twice (2026-12-06: a segfault inside XLA's
# executable.serialize() while caching a V-cycle's train step, after an unknown mix of earlier tests in that worker;
# the test alone passes).
jax.config.update("jax_enable_compilation_cache", False)

import pytest  # noqa: E402


def memory_maps() -> int | None:
  """How many memory mappings this process holds (None off Linux)."""
  try:
    with open("/proc/self/maps") as f:
      return sum(1 for _ in f)
  except OSError:
    return None


def _map_limit() -> int:
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read())
  except (OSError, ValueError):
    return 65530


# A pytest worker trains hundreds of configs, and every compiled step kept for reuse holds its code in memory
# mappings (1-3 thousand per tiny V-cycle run): past vm.max_map_count a memmap or a new thread fails with ENOMEM
# (CI at 2c16e3a lost five tests of one worker that way). So the worker drops its compiled functions when it
# passes half the limit; tests that share a step within a module mostly run before that happens again.
MAPS_HIGH = _map_limit() // 2


@pytest.fixture(autouse=True)
def _bounded_memory_maps():
  yield
  n = memory_maps()
  if n is not None and n > MAPS_HIGH:
    from multilevel.train.step import clear_compiled
    clear_compiled()


@pytest.fixture(scope="session")
def gpt_reference(tmp_path_factory):
  """The 2-level V-cycle of the GPT test config on one device (summary), shared by the multi-device tests."""
  from multilevel.cycles.driver import train_and_evaluate
  from tests.engine_util import tiny_config
  return train_and_evaluate(tiny_config("gpt", levels=2), str(tmp_path_factory.mktemp("gpt-reference") / "run"))
