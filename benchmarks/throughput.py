"""Train-step tokens/s of our JAX step against Hugging Face transformers (PyTorch) for the same shapes, in one run.

    python -m benchmarks.throughput [--models gpt,bert] [--layers 4 --heads 4 --head_dim 64 --ffn_ratio 4]
        [--vocab 8192 --seq 128 --batch 8] [--warmup 2 --rounds 5 --steps 2] [--single_thread] [--torch_compile]
        [--out benchmarks/results/throughput.json]

Both sides start from the same weights (ours exported with ``multilevel.interop.to_hf_model``), fp32, dropout 0,
tied embeddings, AdamW (lr 1e-4, weight decay 0.01 on matrices and embeddings only, betas 0.9/0.999, eps 1e-8,
constant learning rate) and global-norm clipping at 1.0.

- Ours: the jitted train step of ``multilevel.train.build_steps`` on one device (the engine's own step), blocked
  on its outputs after every step. Compilation is excluded.
- Hugging Face: ``GPT2LMHeadModel`` / ``BertForMaskedLM`` in ``train()`` mode, ``torch.set_num_threads(cpu count)``;
  a step is forward, loss, backward, ``clip_grad_norm_``, ``AdamW.step`` and ``zero_grad``.
- GPT: each row holds seq + 1 tokens; both sides run the model on the first seq and predict the next token at all
  seq positions (HF: logits, then ``F.cross_entropy``), so both process exactly batch x seq positions per step.
- BERT: ours masks round(15%) of each row's positions inside the jitted step (80/10/10 corruption, random numbers on
  device); HF gets inputs corrupted the same way (15% of positions on average) with labels -100 on the others,
  precomputed outside the timed region. The masking is a few element-wise ops and a top-k on a batch x seq array: a
  small extra cost on our side only. HF's ``BertForMaskedLM`` computes the head (transform and vocabulary logits) at
  every position and ignores 85% of them in the loss; ours gathers the masked positions first and runs the head
  there only (what the engine trains with): the BERT ratio includes that saving, the GPT ratio is kernel for kernel.
- ``--torch_compile``: a third side, the same HF model under ``torch.compile`` (inductor, default mode); its first
  step compiles, outside the timed part.

Warm-up steps (excluded) are the same on both sides. The timed part runs in rounds; each round times ``--steps``
steps of ours and of HF back to back (the order alternates between rounds, so a slow drift of the machine does not
favour one side), and the reported ratio is the median of the per-round ratios. Tokens/s columns are medians over
rounds. Run it on an idle machine for absolute numbers; the ratio is what survives a busy one, with one caveat:
PyTorch's multi-threaded (OpenMP) kernels degrade badly when other processes share the cores (each op waits at a
barrier for its slowest thread), XLA's much less. On the 2-core dev VM with a load average of about 5, a pure-torch
GPT step (no JAX in the process) took 1.3-4.8 s with 2 threads and 0.8 s with 1. On a busy machine compare with
``--single_thread`` (one thread on both sides) as well. The JSON file keeps the latest result of each thread mode
under ``runs``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
import types

import numpy as np
from absl import flags

from benchmarks import cli

MASK_ID = 4  # Any id works for throughput; both sides use the same one.


def define_flags(fv: flags.FlagValues) -> None:
  """Declares this script's flags on ``fv``."""
  flags.DEFINE_string("models", "gpt,bert", "Comma-separated: gpt (causal LM), bert (masked LM).", flag_values=fv)
  flags.DEFINE_integer("layers", 4, "Layers.", flag_values=fv)
  flags.DEFINE_integer("heads", 4, "Attention heads.", flag_values=fv)
  flags.DEFINE_integer("head_dim", 64, "Width of a head.", flag_values=fv)
  flags.DEFINE_integer("ffn_ratio", 4, "FFN width over model width.", flag_values=fv)
  flags.DEFINE_integer("vocab", 8192, "Vocabulary (random tokens).", flag_values=fv)
  flags.DEFINE_integer("seq", 128, "Positions the model processes per example.", flag_values=fv)
  flags.DEFINE_integer("batch", 8, "Examples per step (8 keeps a step under ~1.5 s on the 2-core dev VM even for HF; "
                       "16 is fine on an idle machine).", flag_values=fv)
  flags.DEFINE_integer("warmup", 2, "Untimed steps per framework after compilation.", flag_values=fv)
  flags.DEFINE_integer("rounds", 5, "Timed rounds.", flag_values=fv)
  flags.DEFINE_integer("steps", 2, "Timed steps per framework per round.", flag_values=fv)
  flags.DEFINE_integer("threads", 0, "torch threads (0 = os.cpu_count()).", flag_values=fv)
  flags.DEFINE_bool("single_thread", False, "One thread on both sides (torch.set_num_threads(1) and XLA's "
                    "single-threaded Eigen): a check that is less sensitive to other jobs on the machine than two "
                    "threads that must meet at every op's barrier.", flag_values=fv)
  flags.DEFINE_bool("torch_compile", False, "Also time Hugging Face's model under torch.compile (inductor; needs a C++ "
                    "compiler; compiling takes minutes on a small CPU).", flag_values=fv)
  flags.DEFINE_integer("seed", 0, "Seed of the weights and batches.", flag_values=fv)
  cli.define_timing_output(fv, "throughput.json")


def parse_args(argv: list[str] | None = None) -> types.SimpleNamespace:
  """The flags as a namespace: of ``argv`` if given, else of the command line."""
  return cli.parse(define_flags, argv)


def model_config(family: str, a):
  from multilevel import models as M
  # GPT's step predicts token t+1 from tokens <= t, so its rows hold seq + 1 tokens and max_len = seq + 1.
  return M.ModelConfig(family, a.layers, a.heads, a.head_dim, a.ffn_ratio, vocab_size=a.vocab,
                       max_len=a.seq + 1 if family == "gpt" else a.seq, dropout=0.0, dtype="float32")


def make_batches(family: str, cfg, a, n: int = 4):
  """``n`` batches: our rows (numpy) and the matching torch inputs/labels (BERT corrupted outside the timed part)."""
  rng = np.random.default_rng(a.seed)
  out = []
  for _ in range(n):
    if family == "gpt":
      rows = rng.integers(0, cfg.vocab_size, (a.batch, a.seq + 1), dtype=np.int32)
      out.append((rows, rows[:, :-1].astype(np.int64), rows[:, 1:].astype(np.int64)))
    else:
      rows = rng.integers(5, cfg.vocab_size, (a.batch, a.seq), dtype=np.int32)
      picked = rng.random(rows.shape) < 0.15
      kind = rng.random(rows.shape)
      inputs = np.where(picked & (kind < 0.8), MASK_ID, rows)
      inputs = np.where(picked & (kind >= 0.8) & (kind < 0.9), rng.integers(0, cfg.vocab_size, rows.shape), inputs)
      labels = np.where(picked, rows, -100)
      out.append((rows, inputs.astype(np.int64), labels.astype(np.int64)))
  return out


class Ours:
  """Our engine's jitted train step on one device."""

  def __init__(self, family, cfg, params, batches):
    import jax
    import jax.numpy as jnp

    from multilevel.train import LrSchedule, ObjectiveConfig, OptimConfig, StepConfig, build_steps, make_mesh, put_batch
    self.jax, self.jnp = jax, jnp
    mesh = make_mesh("", 1)
    self.objective = ObjectiveConfig(mask_id=MASK_ID, pad_id=-1, mlm_prob=0.15)
    sc = StepConfig(cfg, self.objective, grad_accum=1, seed=0)
    oc = OptimConfig(LrSchedule(peak=1e-4, steps=10**7, warmup=0, decay="constant"), weight_decay=0.01,
                     grad_clip=1.0)
    steps = build_steps(sc, oc, mesh)
    params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)  # The step donates its state.
    self.state = steps.init_state(params)
    self.batches = [put_batch({"tokens": rows}, mesh) for rows, _, _ in batches]
    self.g = 0
    t0 = time.perf_counter()
    self.train = steps.compile_train(self.state, self.batches[0], jnp.int32(0))
    self.compile_seconds = time.perf_counter() - t0
    self.losses = []

  def step(self):
    self.state, metrics = self.train(self.state, self.batches[self.g % len(self.batches)], self.jnp.int32(self.g))
    self.jax.block_until_ready((self.state, metrics))
    self.g += 1
    return metrics

  def run(self, n):
    m = None
    for _ in range(n):
      m = self.step()
    if m is not None:
      self.losses.append(float(m["loss"]))


class HF:
  """The same model in transformers: a plain PyTorch training step."""

  def __init__(self, family, cfg, params, batches, compile_model: bool = False):
    import torch
    import torch.nn.functional as F

    from multilevel.interop import to_hf_model
    self.torch, self.F, self.family = torch, F, family
    self.model = to_hf_model(cfg, params).float().train()
    self.forward = torch.compile(self.model) if compile_model else self.model
    emb_in = self.model.get_input_embeddings().weight
    emb_out = self.model.get_output_embeddings().weight
    self.tied = emb_in.data_ptr() == emb_out.data_ptr()
    self.attn_impl = getattr(self.model.config, "_attn_implementation", None)
    ps = [p for p in self.model.parameters() if p.requires_grad]
    # Same decay mask as ours: matrices and embedding tables decay, biases and LayerNorm do not.
    groups = [{"params": [p for p in ps if p.ndim >= 2], "weight_decay": 0.01},
              {"params": [p for p in ps if p.ndim < 2], "weight_decay": 0.0}]
    self.opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-8)
    self.params = ps
    self.batches = [(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y)))
                    for _, x, y in batches]
    self.g = 0
    self.losses = []

  def step(self):
    x, y = self.batches[self.g % len(self.batches)]
    if self.family == "gpt":
      logits = self.forward(input_ids=x).logits
      loss = self.F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    else:
      loss = self.forward(input_ids=x, labels=y).loss
    loss.backward()
    self.torch.nn.utils.clip_grad_norm_(self.params, 1.0)
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
    self.g += 1
    return loss

  def run(self, n):
    loss = None
    for _ in range(n):
      loss = self.step()
    if loss is not None:
      self.losses.append(float(loss.detach()))


def bench_family(family: str, a) -> dict:
  import torch

  from multilevel import models as M
  from multilevel.train import train_flops_per_step
  cfg = model_config(family, a)
  params = M.init_params(cfg, a.seed)
  batches = make_batches(family, cfg, a)
  sides = {"hf": HF(family, cfg, params, batches)}
  if a.torch_compile:
    sides["hf_compile"] = HF(family, cfg, params, batches, compile_model=True)
  ours = Ours(family, cfg, params, batches)
  sides = {"ours": ours, **sides}

  # Sanity: on the very first batch and the same weights the losses must agree (GPT exactly; BERT differs by its
  # masks). Taken from the first warm-up step of each side (torch.compile compiles here, outside the timed part).
  first = {}
  for name, side in sides.items():
    t0 = time.perf_counter()
    loss = side.step()
    first[name] = float(loss["loss"] if name == "ours" else loss.detach())
    if name == "hf_compile":
      print(f"  {family}: torch.compile's first step (compiling) took {time.perf_counter() - t0:.1f} s", flush=True)
  for side in sides.values():
    side.run(max(a.warmup - 1, 0))

  tokens = a.batch * a.seq * a.steps
  others = [n for n in sides if n != "ours"]
  rounds = []
  for r in range(a.rounds):
    times = {}
    order = list(sides) if r % 2 == 0 else list(sides)[::-1]
    for name in order:
      t0 = time.perf_counter()
      sides[name].run(a.steps)
      times[name] = time.perf_counter() - t0
    rounds.append({**{f"{n}_tokens_per_s": tokens / times[n] for n in sides},
                   **{("ratio" if n == "hf" else f"ratio_{n}"): times[n] / times["ours"] for n in others},
                   "first": order[0]})
    print(f"  {family} round {r}: " + ", ".join(f"{n} {rounds[-1][f'{n}_tokens_per_s']:.0f} tok/s" for n in sides)
          + ", ratio " + ", ".join(f"{rounds[-1]['ratio' if n == 'hf' else f'ratio_{n}']:.3f}" for n in others),
          flush=True)
  ours_tps = statistics.median(x["ours_tokens_per_s"] for x in rounds)
  hf_tps = statistics.median(x["hf_tokens_per_s"] for x in rounds)
  ratios = [x["ratio"] for x in rounds]
  hf = sides["hf"]
  extra = {}
  if "hf_compile" in sides:
    rc = [x["ratio_hf_compile"] for x in rounds]
    extra = {"hf_compile_tokens_per_s": statistics.median(x["hf_compile_tokens_per_s"] for x in rounds),
             "ratio_compile_median": statistics.median(rc), "ratio_compile_min": min(rc),
             "ratio_compile_max": max(rc)}
  step_flops = train_flops_per_step(cfg, a.batch, ours.objective)
  return {
      "model": family, "objective": "causal LM" if family == "gpt" else "masked LM (15%)",
      "shape": {"layers": cfg.num_layers, "heads": cfg.num_heads, "head_dim": cfg.head_dim, "width": cfg.width,
                "ffn": cfg.ffn_dim, "vocab": cfg.vocab_size, "seq": a.seq, "batch": a.batch},
      "params": M.num_params(params),
      "ours_tokens_per_s": ours_tps, "hf_tokens_per_s": hf_tps,
      "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
      "ours_step_s": a.batch * a.seq / ours_tps, "hf_step_s": a.batch * a.seq / hf_tps,
      "analytic_train_flops_per_step": step_flops,
      "ours_gflops_per_s": step_flops * ours_tps / (a.batch * a.seq) / 1e9,
      "hf_gflops_per_s": step_flops * hf_tps / (a.batch * a.seq) / 1e9,
      "ours_compile_s": ours.compile_seconds,
      **extra,
      "first_step_loss": first, "last_loss": {n: side.losses[-1] for n, side in sides.items()},
      "hf_attn_implementation": hf.attn_impl, "hf_tied_embeddings": hf.tied,
      "torch_threads": torch.get_num_threads(), "rounds": rounds,
  }


def table(rows) -> str:
  compiled = any("ratio_compile_median" in r for r in rows)
  head = "| model | ours tokens/s | HF tokens/s | ratio ours/HF (median, [min, max]) |"
  rule = "|---|---:|---:|---:|"
  if compiled:
    head += " HF compiled tokens/s | ratio ours/HF compiled |"
    rule += "---:|---:|"
  lines = [head + " ours / HF step s |", rule + "---:|"]
  for r in rows:
    s = r["shape"]
    name = (f"{'GPT-2 CLM' if r['model'] == 'gpt' else 'BERT MLM'} L{s['layers']} d{s['width']} "
            f"h{s['heads']} ffn{s['ffn']} V{s['vocab']}, {s['batch']}x{s['seq']}")
    line = (f"| {name} | {r['ours_tokens_per_s']:,.0f} | {r['hf_tokens_per_s']:,.0f} | "
            f"{r['ratio_median']:.2f} [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}] |")
    if compiled:
      line += (f" {r['hf_compile_tokens_per_s']:,.0f} | {r['ratio_compile_median']:.2f} [{r['ratio_compile_min']:.2f}, "
               f"{r['ratio_compile_max']:.2f}] |" if "ratio_compile_median" in r else " - | - |")
    lines.append(line + f" {r['ours_step_s']:.3f} / {r['hf_step_s']:.3f} |")
  return "\n".join(lines)


def main(argv):
  del argv
  a = parse_args()
  if a.single_thread:  # Must be set before jax is imported.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    a.threads = 1
  import torch
  torch.set_num_threads(a.threads or os.cpu_count())
  import jax
  import transformers

  load0 = os.getloadavg()
  started = time.strftime("%Y-%m-%d %H:%M:%S")
  print(f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers {transformers.__version__}, {os.cpu_count()} CPUs, "
        f"load average {load0[0]:.2f}", flush=True)
  rows = []
  for family in [m.strip() for m in a.models.split(",") if m.strip()]:
    if family not in ("gpt", "bert"):
      raise SystemExit(f"Unknown model {family!r}: choose gpt and/or bert.")
    rows.append(bench_family(family, a))
  load1 = os.getloadavg()
  print()
  print(table(rows))
  busy = max(load0[0], load1[0]) > os.cpu_count()
  if busy and torch.get_num_threads() > 1:
    print(f"\nWARNING: load average above the CPU count with {torch.get_num_threads()} torch threads: PyTorch's "
          "OpenMP kernels slow down far more than XLA's when cores are shared, which inflates the ratio. Compare "
          "with --single_thread.")
  print(f"\nRatio = our tokens/s / HF tokens/s (>1: ours faster); median over {a.rounds} rounds of {a.steps} steps "
        f"each after {a.warmup} warm-up steps. Load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end "
        f"on {os.cpu_count()} CPUs (above the CPU count means other jobs competed for the cores).")
  for r in rows:
    print(f"{r['model']}: first-step loss ours {r['first_step_loss']['ours']:.4f} / HF "
          f"{r['first_step_loss']['hf']:.4f} (same weights; {'same batch' if r['model'] == 'gpt' else 'different masks'})"
          f", HF attention {r['hf_attn_implementation']}, tied {r['hf_tied_embeddings']}, "
          f"ours {r['ours_gflops_per_s']:.0f} / HF {r['hf_gflops_per_s']:.0f} analytic GFLOP/s")
  result = {
      "command": cli.command("benchmarks.throughput"),
      "started": started, "args": vars(a),
      "versions": {"jax": jax.__version__, "jaxlib": getattr(__import__("jaxlib"), "__version__", None),
                   "torch": torch.__version__, "transformers": transformers.__version__,
                   "python": platform.python_version()},
      "backend": jax.default_backend(), "cpu_count": os.cpu_count(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "machine": platform.processor() or platform.machine(),
      "load_average_start": load0, "load_average_end": load1,
      "contention_note": a.note or (
          "Load average above the CPU count means other processes competed for the cores during the run; absolute "
          "tokens/s are then low and noisy, the ratio (both sides measured back to back in each round) less so."),
      "method": "median of per-round ratios; rounds alternate which framework goes first; compilation and warm-up "
                "excluded; BERT masks on our side are drawn inside the step, on HF's precomputed",
      "results": rows,
  }
  if a.out:
    mode = "single_thread" if a.single_thread else f"threads={torch.get_num_threads()}"
    write_result(a.out, mode, result)
    print(f"Wrote {a.out} (runs[{mode!r}])")


def write_result(path: str, mode: str, result: dict) -> None:
  """Stores ``result`` as ``runs[mode]`` of the JSON file at ``path``, keeping the other modes' latest results."""
  doc = {}
  if os.path.exists(path):
    try:
      with open(path) as f:
        doc = json.load(f)
    except (OSError, ValueError):
      doc = {}
  if "runs" not in doc:
    doc = {"runs": {}}
  doc["description"] = ("benchmarks/throughput.py: our JAX train step vs Hugging Face transformers (PyTorch) on "
                        "the same shapes, tokens/s and their ratio; one entry per thread mode (latest run).")
  doc["runs"][mode] = result
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(doc, f, indent=1)
  os.replace(path + ".tmp", path)


if __name__ == "__main__":
  cli.run(main, define_flags)
