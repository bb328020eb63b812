"""Entry point: train one run (a V-cycle, or plain training with --config.cycle.levels=1).

  python -m experiments.train --config=experiments/configs/gpt.py:tiny --workdir=runs/gpt-tiny \
      --config.cycle.levels=2 --config.train.steps=600

Writes DIR/metrics.jsonl, DIR/tensorboard/, DIR/summary.json and DIR/checkpoints/; the same command resumes.
An expected error (a bad config, scheme, data, checkpoint or mesh) prints one line starting with "error:" and exits
with status 1; --debug shows the Python traceback instead. Several processes (on one machine or many) run the same
command with --distributed --coordinator_address=HOST:PORT --num_processes=N --process_id=I, one id each.
"""

import gc
import os
import sys
import time
import warnings

from absl import app, flags, logging
from ml_collections import config_flags

from experiments.errors import report

_CONFIG = config_flags.DEFINE_config_file("config", None, "A config file (experiments/configs/<family>.py:<size>).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the summary.")
_COMPILE_CACHE = flags.DEFINE_string("compilation_cache", "~/.cache/multilevel/jax",
                                     "Persistent XLA compilation cache ('' to disable).")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Join a multi-process run (jax.distributed.initialize); the "
                                  "flags below, or JAX's environment, say where and who.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0's coordinator.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's id, 0 to num_processes - 1.")
_DIST_TIMEOUT = flags.DEFINE_integer("distributed_timeout", 120, "Seconds to wait for the other processes.")
_DEBUG = flags.DEFINE_bool("debug", False, "Show the Python traceback of an error instead of one line.")
flags.mark_flags_as_required(["config", "workdir"])


# How long process 0 of a multi-process run stays after reporting an error, so that the others can report theirs and
# leave first: process 0 hosts JAX's coordination service, and a peer still running when it goes away is aborted by
# JAX (SIGABRT, a C++ stack trace after or instead of its one-line message; seen once in CI, 2026-12-06).
COORDINATOR_GRACE_S = 2.0


def _fail(message: str) -> None:
  if _DISTRIBUTED.present and _DISTRIBUTED.value:
    # A process of a multi-process run cannot shut down cleanly alone: JAX's runtime and Orbax's background threads
    # would wait minutes for peers that may be gone. Say why and leave now, without a garbage collection first (the
    # hard exit prints no warnings to keep out of the way, and every moment here is a moment a peer may pull the
    # coordination service away).
    report(message)
    logging.flush()
    sys.stdout.flush()
    if _process_index() == 0:
      time.sleep(COORDINATOR_GRACE_S)
    os._exit(1)
  # An Orbax save that failed mid-write (a full disk) leaves coroutines that were never awaited; Python would report
  # each as a RuntimeWarning at exit, after the message. They say nothing the message does not, so they are dropped
  # and the message stays the last line.
  warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
  gc.collect()
  report(message)
  sys.exit(1)


def _process_index() -> int | None:
  """This process's index in the run (None before JAX's distributed runtime is up)."""
  try:
    import jax
    return jax.process_index() if jax.distributed.is_initialized() else _PROCESS_ID.value
  except Exception:  # An error path: never fail here too.
    return _PROCESS_ID.value


def _flag_value(argv, name: str):
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _load_config(spec: str):
  """The ConfigDict of ``path[:arg]``, loaded as ml_collections does (the file's ``get_config(arg)``)."""
  import importlib.util
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    _fail(f"--config={spec}: no config file at {path}; the configs are experiments/configs/<family>.py:<size>.")
  module_spec = importlib.util.spec_from_file_location("_multilevel_run_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def check_overrides(argv) -> None:
  """Refuses ``--config.a.b=v`` overrides whose key the config does not have, naming the valid keys of that section
  (ml_collections would raise an AttributeError traceback during flag parsing)."""
  overrides = [a[len("--config."):].split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
  spec = _flag_value(argv[1:], "config")
  if not overrides or spec is None:
    return
  try:
    config = _load_config(spec)
  except (ValueError, KeyError) as e:
    _fail(f"--config={spec}: {e}")
  for key in overrides:
    node, parts = config, key.split(".")
    for i, part in enumerate(parts):
      children = list(node.keys()) if hasattr(node, "keys") else []
      if part not in children:
        section = ".".join(parts[:i]) or "the config"
        where = f"'{section}'" if i else section
        _fail(f"unknown key '{key}' in --config.{key}; valid keys of {where}: {', '.join(children)}.")
      node = node[part]


_TYPE_NAMES = {bool: "True or False", int: "an integer", float: "a number", str: "a string", tuple: "a tuple, e.g. '(1,2)'"}


def _override_type_error(argv, error: str) -> str | None:
  """For a ``--config.a.b=v`` whose value does not parse: which type the key takes and its default."""
  import re
  m = re.match(r"flag --config\.([\w.]+)=(.*?): ", error)
  spec = _flag_value(argv[1:], "config")
  if not m or spec is None:
    return None
  try:
    node = _load_config(spec)
    for part in m.group(1).split("."):
      node = node[part]
  except (KeyError, ValueError, AttributeError, TypeError):
    return None
  kind = next((name for t, name in _TYPE_NAMES.items() if isinstance(node, t)), type(node).__name__)
  return f"--config.{m.group(1)}={m.group(2)}: {m.group(1)} takes {kind} (its default here is {node!r})."


def _parse_flags(argv):
  check_overrides(argv)
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(_override_type_error(argv, str(e)) or f"{e}. Pass --helpfull to see the flags.")
  except (ValueError, KeyError, AttributeError) as e:  # Raised by a config file while it loads.
    _fail(f"--config: {e}")


def check_method_reads(argv, config) -> None:
  """Refuses ``--config.cycle.<key>`` overrides of the V-cycle's own options that the run does not read: under
  another built-in method, or under a V-cycle whose shape leaves them out (``cycles.config.unread_keys``: e.g.
  ``cycle.down_fracs`` with ``cycle.small_init='fresh'``). They would be ignored, and a setting that changes nothing
  is a mistake the user should hear of."""
  from multilevel.cycles.config import unread_keys
  method = config.cycle.method
  keys = [a[len("--config.cycle."):].split("=", 1)[0] for a in argv[1:] if a.startswith("--config.cycle.")]
  unread = unread_keys(config.cycle)
  for k in keys:
    if k in unread:
      fix = ("Leave it out, or run cycle.method='vcycle'." if method != "vcycle" else
             "Leave it out, or change the setting that leaves it unread.")
      _fail(f"--config.cycle.{k} is not read by this run: {unread[k]}. {fix}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  check_method_reads(sys.argv, _CONFIG.value)
  import jax

  if _DISTRIBUTED.value:
    from multilevel.distributed import DistributedError, initialize
    try:
      initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, _DIST_TIMEOUT.value)
    except DistributedError as e:
      _fail(str(e))
  if _COMPILE_CACHE.value:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(_COMPILE_CACHE.value))
  from multilevel.cycles.driver import EXPECTED_ERRORS, train_and_evaluate

  logging.info("JAX %s on %s (%d devices, %d process%s)", jax.__version__, jax.default_backend(), jax.device_count(),
               jax.process_count(), "es" if jax.process_count() > 1 else "")
  try:
    summary = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except EXPECTED_ERRORS as e:
    if _DEBUG.value:
      raise
    _fail(f"{e} (run with --debug for the traceback)" if isinstance(e, (TypeError, KeyError)) else str(e))
  except KeyboardInterrupt:
    if _DEBUG.value:
      raise
    print(f"interrupted: run the same command to resume {_WORKDIR.value} from its last complete checkpoint.",
          file=sys.stderr, flush=True)
    sys.exit(130)
  print(f"final eval loss {summary['final_eval_loss']:.4f} | {summary['total_flops']:.3g} FLOPs | "
        f"{summary['train_seconds']:.1f} s training | params sha256 {summary['params_sha256']} | "
        f"{os.path.join(_WORKDIR.value, 'summary.json')}")


if __name__ == "__main__":
  from experiments.errors import config_folder_on_path
  config_folder_on_path(sys.argv)
  app.run(main, flags_parser=_parse_flags)
