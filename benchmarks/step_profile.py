"""Where a train step's time goes, the coalesced small model's against the big one's, part by part.

    python -m benchmarks.step_profile [--families gpt,bert,deit] [--steps 10]
        [--out benchmarks/results/step_profile.json]

``benchmarks/step_ratio.py`` shows that a small-model step costs more than its FLOPs share of a big one. This says
why: it traces ``--steps`` steps of each model (``step_ratio``'s models, batches and jitted train step, after
compilation and ``--warmup`` steps) with ``jax.profiler``, gives every traced XLA operation of the step to one of
the step's parts by the name scope it was traced under (its HLO ``op_name``: the loss head's chunked cross-entropy
runs under ``vocab_loss``, the optimizer update under ``optimizer``, the transformer blocks under the model's
``layers`` module; everything else, embeddings, final norm, BERT's masked-LM transform and DeiT's patch embedding,
is ``rest``), and as ``matmul`` (a dot or convolution, or a fusion that contains one) or ``other`` (elementwise
work, reductions, copies, transposes). For each part it reports the milliseconds per step of each model, their
ratio small / big, and the part's analytic FLOPs ratio where FLOPs are counted (``train/flops.py``: the blocks and
the vocabulary head). A part whose time ratio is above its FLOPs ratio is where the small step loses.

The persistent compilation cache is turned off here: its keys leave the HLO metadata (the name scopes) out, so an
executable compiled by older code would come back with that code's scopes; ``traced`` refuses a step whose HLO names
no ``optimizer`` scope for that reason.

The times are the operations' own durations summed (XLA's CPU runtime may run two at once, so they can add up to
more than the step's wall time, which is reported beside them); control-flow operations (``while``) enclose their
bodies' operations and are not counted themselves. An operation is found in the trace by its ``hlo_op`` argument (XLA's CPU
runtime records it; checked here) or else by its event name; events that carry an ``hlo_op`` the step's HLO does not
name are reported as ``unmatched_ms``, and ``matched_events`` counts the ones found (none found on a backend whose
trace names its operations some other way: the split is then empty, not wrong).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import statistics
import tempfile
import types

from absl import flags

from benchmarks import cli

PARTS = ("blocks", "vocab_loss", "optimizer", "rest")
KINDS = ("matmul", "other")
CONTROL_FLOW = ("while", "conditional", "call")

_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\) -> .* \{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?\s([a-z][\w\-]*)\(([^)]*)\)")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|called_computations)=\{?%?([\w.\-]+(?:, %?[\w.\-]+)*)\}?")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``."""
  flags.DEFINE_string("families", "gpt,bert,deit", "Comma-separated families.", flag_values=fv)
  flags.DEFINE_integer("steps", 10, "Traced steps per model.", flag_values=fv)
  flags.DEFINE_integer("warmup", 3, "Untimed steps per model after compilation.", flag_values=fv)
  cli.define_timing_output(fv, "step_profile.json")


def parse_args(argv: list[str] | None = None) -> types.SimpleNamespace:
  """The flags as a namespace: of ``argv`` if given, else of the command line."""
  return cli.parse(define_flags, argv)


def part_of(op_name: str) -> str:
  """The step's part an operation belongs to, from the name scopes in its HLO ``op_name``."""
  if "optimizer" in op_name:
    return "optimizer"
  if "vocab_loss" in op_name:
    return "vocab_loss"
  if re.search(r"(^|/)layers(/|$)", op_name):
    return "blocks"
  return "rest"


def classify_hlo(text: str) -> dict[str, tuple[str, str]]:
  """``{instruction name: (part, kind)}`` for the instructions of an HLO module's text (``compiled.as_text()``)
  that run as operations: every instruction of every computation, less control flow and the computations that
  fusions call (their instructions run inside the fusion). ``kind`` is ``matmul`` for a dot, a convolution or a
  fusion whose computation holds one."""
  computations: dict[str, list[tuple[str, str, list[str], str]]] = {}
  operands: dict[str, list[str]] = {}
  current = None
  for line in text.splitlines():
    head = _COMPUTATION.match(line)
    if head:
      current = computations.setdefault(head.group(1), [])
      continue
    if line.startswith("}"):
      current = None
      continue
    inst = _INSTRUCTION.match(line) if current is not None else None
    if inst:
      calls = [c.strip().lstrip("%") for m in _CALLS.finditer(line) for c in m.group(1).split(",")]
      op = _OP_NAME.search(line)
      current.append((inst.group(1), inst.group(2), calls, op.group(1) if op else ""))
      operands[inst.group(1)] = re.findall(r"%([\w.\-]+)", inst.group(3))

  memo: dict[str, bool] = {}

  def has_matmul(name: str) -> bool:
    if name not in memo:
      memo[name] = False
      memo[name] = any(opcode in ("dot", "convolution") or any(has_matmul(c) for c in calls)
                       for _, opcode, calls, _ in computations.get(name, ()))
    return memo[name]

  def scope_of(name: str, seen=()) -> str:
    # A fusion XLA built without metadata of its own: the first op_name inside its computation.
    for _, _, calls, op_name in computations.get(name, ()):
      if op_name:
        return op_name
    for _, _, calls, _ in computations.get(name, ()):
      for c in calls:
        if c not in seen:
          found = scope_of(c, seen + (name,))
          if found:
            return found
    return ""

  fused = {c for insts in computations.values() for _, opcode, calls, _ in insts if opcode == "fusion"
           for c in calls}
  scopes: dict[str, str] = {}
  kinds: dict[str, str] = {}
  for comp, insts in computations.items():
    if comp in fused:
      continue
    for name, opcode, calls, op_name in insts:
      scopes[name] = op_name or next((found for found in map(scope_of, calls) if found), "")
      if opcode in CONTROL_FLOW or opcode in ("parameter", "constant", "get-tuple-element", "tuple", "bitcast"):
        continue
      matmul = opcode in ("dot", "convolution") or (opcode in ("fusion", "custom-call") and
                                                     any(has_matmul(c) for c in calls))
      kinds[name] = "matmul" if matmul else "other"
  # Still no scope (XLA drops the metadata of some fusions, e.g. a one-head attention's dots): the first operand's.
  for _ in range(8):
    missing = [n for n in kinds if not scopes[n]]
    for name in missing:
      scopes[name] = next((scopes[o] for o in operands.get(name, ()) if scopes.get(o)), "")
    if not missing:
      break
  return {name: (part_of(scopes[name]), kind) for name, kind in kinds.items()}


def trace_op_ms(trace_dir: str, ops: dict[str, tuple[str, str]], steps: int) -> dict:
  """Milliseconds per step of each (part, kind) in the ``jax.profiler`` trace under ``trace_dir``, plus the traced
  operations' total and what the trace held that ``ops`` does not name."""
  files = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  if not files:
    raise FileNotFoundError(f"No *.trace.json.gz under {trace_dir}: jax.profiler wrote no trace.")
  with gzip.open(files[0]) as f:
    events = json.load(f)["traceEvents"]
  by = collections.Counter()
  unmatched, matched = 0.0, 0
  for e in events:
    if e.get("ph") != "X":
      continue
    args = e.get("args") or {}
    name = args.get("hlo_op") or e.get("name", "")
    if name in ops:
      by[ops[name]] += e["dur"]
      matched += 1
    elif "hlo_op" in args and not name.split(".")[0] in CONTROL_FLOW:
      unmatched += e["dur"]
  ms = lambda us: us / 1e3 / steps
  table = {part: {kind: ms(by[(part, kind)]) for kind in KINDS} for part in PARTS}
  return {"ms": table, "op_ms": ms(sum(by.values())), "unmatched_ms": ms(unmatched), "matched_events": matched}


def traced(run, hlo_text: str, steps: int) -> dict:
  """The breakdown (``trace_op_ms``) of ``run()``, which must run ``steps`` steps of the executable whose HLO text is
  ``hlo_text`` and block on their results, traced by ``jax.profiler``. An executable with no ``optimizer`` scope
  (every train step of the engine has one) is refused before anything is traced: it was compiled from older code,
  most likely read back from a persistent compilation cache, whose keys leave the HLO metadata out."""
  import jax
  ops = classify_hlo(hlo_text)
  if not any(part == "optimizer" for part, _ in ops.values()):
    raise ValueError("The step's compiled HLO names no 'optimizer' scope, so its operations cannot be given to their "
                     "parts: the executable was compiled from code without the engine's name scopes, most likely read "
                     "back from a persistent compilation cache (its keys ignore the HLO metadata). Run without one: "
                     "unset JAX_COMPILATION_CACHE_DIR or point it at an empty directory.")
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      run()
    return trace_op_ms(d, ops, steps)


def profile_side(timed, steps: int) -> dict:
  """Wall time per step (untraced) and the traced breakdown of ``timed`` (a ``step_ratio.Timed``)."""
  wall = statistics.median(timed.run(1) for _ in range(steps))
  return {"wall_ms": 1e3 * wall, **traced(lambda: timed.run(steps), timed.train.as_text(), steps)}


def _ratio(x: float, y: float) -> float:
  return x / y if y else float("nan")


def compare_parts(big: dict, small: dict) -> dict:
  """Per part of the step, from two ``trace_op_ms`` breakdowns: ``big_ms``, ``small_ms`` and their ratios (the
  part's, and each kind's: ``matmul_time_ratio``, ``other_time_ratio``; NaN where the big model spent nothing)."""
  out = {}
  for part in PARTS:
    b, s = big["ms"][part], small["ms"][part]
    out[part] = {"big_ms": sum(b.values()), "small_ms": sum(s.values()),
                 "time_ratio": _ratio(sum(s.values()), sum(b.values())),
                 **{f"{kind}_time_ratio": _ratio(s[kind], b[kind]) for kind in KINDS}}
  return out


def part_flops(cfg, batch: int, objective) -> dict:
  """Analytic train FLOPs per step of the blocks and of everything else (the head; ``train/flops.py``)."""
  from multilevel.models import family_of
  from multilevel.train import train_flops_per_step
  total = train_flops_per_step(cfg, batch, objective)
  head = 3.0 * family_of(cfg).head_flops(cfg, objective) * batch
  return {"blocks": total - head, "head": head, "total": total}


def measure(family: str, a) -> dict:
  from benchmarks import step_ratio
  from multilevel import operators as O
  big, batch = step_ratio.big_config(family)
  small = O.make_mapping(big).small
  sides = {"big": step_ratio.Timed(big, batch), "small": step_ratio.Timed(small, batch)}
  for side in sides.values():
    side.run(a.warmup)
  res = {k: profile_side(v, a.steps) for k, v in sides.items()}
  obj = sides["big"].objective
  flops = {k: part_flops(c, batch, obj) for k, c in (("big", big), ("small", small))}
  parts = compare_parts(res["big"], res["small"])
  parts["blocks"]["flops_ratio"] = flops["small"]["blocks"] / flops["big"]["blocks"]
  out = {"family": family, "batch": batch, "big": f"L{big.num_layers}/d{big.width}/h{big.num_heads}",
         "small": f"L{small.num_layers}/d{small.width}/h{small.num_heads}", "sides": res, "flops": flops,
         "flops_ratio": flops["small"]["total"] / flops["big"]["total"],
         "head_flops_ratio": _ratio(flops["small"]["head"], flops["big"]["head"]),
         "wall_ratio": res["small"]["wall_ms"] / res["big"]["wall_ms"],
         "op_ratio": res["small"]["op_ms"] / res["big"]["op_ms"], "parts": parts}
  print(f"{family}: wall {res['big']['wall_ms']:.1f} / {res['small']['wall_ms']:.1f} ms (ratio "
        f"{out['wall_ratio']:.3f}), traced ops {res['big']['op_ms']:.1f} / {res['small']['op_ms']:.1f} ms (ratio "
        f"{out['op_ratio']:.3f}); FLOPs ratio {out['flops_ratio']:.3f} (blocks "
        f"{parts['blocks']['flops_ratio']:.3f}, head {out['head_flops_ratio']:.3f})", flush=True)
  for part in PARTS:
    p = parts[part]
    kinds = ", ".join(f"{kind} {res['big']['ms'][part][kind]:.1f} -> {res['small']['ms'][part][kind]:.1f}"
                      for kind in KINDS)
    print(f"  {part:10s} big {p['big_ms']:6.1f} ms, small {p['small_ms']:6.1f} ms, ratio {p['time_ratio']:.3f} "
          f"({kinds})", flush=True)
  return out


def main(argv):
  del argv
  a = parse_args()
  import jax
  jax.config.update("jax_enable_compilation_cache", False)  # A cached executable may carry older name scopes.
  cli.time_each("benchmarks.step_profile", a, measure, checked_families(a))


def checked_families(a) -> list[str]:
  """The families to profile; bad flags are refused (``app.UsageError``) before anything is built."""
  if a.steps < 1 or a.warmup < 0:
    from absl import app
    raise app.UsageError(f"--steps must be 1 or more and --warmup 0 or more, got {a.steps} and {a.warmup}.")
  return cli.families(a)


if __name__ == "__main__":
  cli.run(main, define_flags)
