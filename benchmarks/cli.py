"""The benchmarks' one command-line style: absl flags, declared by a function rather than at import.

Each script has ``define_flags(fv)`` and ends in ``cli.run(main, define_flags)``; its ``main`` reads the values with
``cli.parse(define_flags)``. Declaring the flags only when a script runs keeps every script importable (``gpu``
imports ``saving``, tests import ``gpu``) without two modules claiming the same flag name.
"""

from __future__ import annotations

import shlex
import sys
import types
from typing import Callable

from absl import app, flags

Define = Callable[[flags.FlagValues], None]


def parse(define: Define, argv: list[str] | None = None) -> types.SimpleNamespace:
  """The values of the flags ``define`` declares, as a namespace: parsed from ``argv`` (flags only, no program name)
  on a fresh ``FlagValues``, or with None read from the command line that ``run`` parsed."""
  fv = flags.FlagValues()
  define(fv)
  if argv is not None:
    rest = fv(["benchmark"] + list(argv))
    if len(rest) > 1:
      raise app.UsageError(f"Unexpected arguments: {' '.join(rest[1:])}")
  source = fv if argv is not None else flags.FLAGS
  return types.SimpleNamespace(**{name: source[name].value for name in fv})


def run(main: Callable[[list[str]], object], define: Define, positional: bool = False) -> None:
  """Declares the flags on ``absl.flags.FLAGS`` and runs ``main(argv)`` under ``absl.app`` (its return value is
  dropped); arguments that are not flags are refused unless ``positional``."""

  def checked(argv):
    if len(argv) > 1 and not positional:
      raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    main(argv)

  define(flags.FLAGS)
  app.run(checked)


def define_timing_output(fv: flags.FlagValues, results_name: str) -> None:
  """The two flags every timing script shares: ``--note`` (what else ran on the machine, stored in the JSON) and
  ``--out`` (default ``benchmarks/results/<results_name>``; '' = do not write)."""
  import os
  flags.DEFINE_string("note", "", "Free text stored in the JSON (e.g. what else ran on the machine).", flag_values=fv)
  default = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", results_name)
  flags.DEFINE_string("out", default, "JSON results ('' = do not write).", flag_values=fv)


def report_timing(module: str, a: types.SimpleNamespace, results, load_start, load_end) -> None:
  """Prints the load averages a timing script ran under and writes its results as JSON at ``a.out`` (whole or not at
  all; nothing when ``a.out`` is ''), with what it ran on: the command, start time, flags, JAX version and backend,
  CPUs, ``XLA_FLAGS``, the load averages at the start and end, and ``a.note``."""
  import os
  import time

  print(f"Load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end on {os.cpu_count()} CPUs.")
  if not a.out:
    return

  import jax

  from multilevel.files import write_json_atomic
  write_json_atomic(a.out, {
      "command": command(module), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(a),
      "jax": jax.__version__, "backend": jax.default_backend(), "cpu_count": os.cpu_count(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""), "load_average_start": load_start, "load_average_end": load_end,
      "note": a.note, "results": results})
  print(f"Wrote {a.out}")


def time_each(module: str, a: types.SimpleNamespace, measure, items) -> None:
  """Runs ``measure(item, a)`` for each of ``items`` and reports the results as ``report_timing`` does, with the load
  averages before and after."""
  import os
  load_start = os.getloadavg()
  results = [measure(item, a) for item in items]
  report_timing(module, a, results, load_start, os.getloadavg())


def families(a: types.SimpleNamespace, known: tuple[str, ...] = ("gpt", "bert", "deit")) -> list[str]:
  """The comma-separated ``a.families``, stripped, empty ones dropped; a name not in ``known`` (or none at all) is
  refused with the names that are."""
  names = [f.strip() for f in a.families.split(",") if f.strip()]
  bad = [f for f in names if f not in known]
  if bad or not names:
    raise app.UsageError(f"--families={a.families!r}: {'unknown ' + ', '.join(bad) if bad else 'none given'}; "
                         f"name one or more of {', '.join(known)}, comma-separated.")
  return names


def command(module: str) -> str:
  """The command line that ran ``module``, as a results file records it: ``python -m benchmarks.gpu --smoke``."""
  return shlex.join(["python", "-m", module] + sys.argv[1:])


def run_report(define: Define, measure: Callable[[types.SimpleNamespace], dict],
               table: Callable[[dict], str]) -> None:
  """``run`` for a script that reads results files into one report: ``measure(flags) -> dict`` is printed as
  ``table(dict)`` and written as JSON to the script's ``--out`` (if given; ``write_report``)."""

  def main(argv):
    del argv
    a = parse(define)
    d = measure(a)
    print(table(d))
    if a.out:
      write_report(a.out, d)

  run(main, define)


def write_report(path: str, d: dict) -> None:
  """``d`` as JSON at ``path``, whole or not at all: a value JSON cannot hold, or a full disk, leaves an earlier file
  there as it was and no partial one."""
  import json

  from multilevel.files import write_text_atomic
  write_text_atomic(path, json.dumps(d, indent=1))


def read_report(path: str, what: str = "") -> dict:
  """A JSON results file, or a usage error naming it (after ``what``: the option or role it was given as, e.g.
  ``"--own: "``) and why it cannot be read (missing, unreadable, not JSON)."""
  import json
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise app.UsageError(f"{what}{path}: cannot read it ({e}).") from None
