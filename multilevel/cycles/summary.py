"""What a finished run records in its ``summary.json``: the final evaluation, the cost (FLOPs, seconds, steps,
examples, epochs), each stage's record, the parameters' digest, the data and model, and what travels with the weights
(``experiments.export`` writes it beside them): an image folder's class names, the images' normalisation, the
tokenizer and its special ids. The driver (``driver.Runner.finish``) writes it; the benchmarks and
``experiments.plot`` read it."""

from __future__ import annotations

import os
import shutil

from multilevel import models as M
from multilevel.cycles.plan import Plan
from multilevel.cycles.position import RunPosition
from multilevel.metrics import params_digest


def run_summary(plan: Plan, pos: RunPosition, model: M.ModelConfig, info, data, ev: dict, params,
                eval_batches) -> dict:
  """The summary of a run that ended at ``pos`` with ``params`` (the last stage's model, evaluated as ``ev``), on
  the data ``info`` describes (``data``: its config; ``eval_batches``: what each evaluation reads)."""
  per_stage = []
  for st, rec in zip(plan.stages, pos.per_stage):
    c = plan.levels[st.level]
    per_stage.append(dict(vars(rec), kind=st.kind, level=st.level,
                          model=f"L{c.num_layers}/d{c.width}/h{c.num_heads}/f{c.ffn_dim}",
                          params=M.num_params(M.abstract_params(c))))
  summary = {
      "final_eval_loss": ev["eval_loss"],
      "final_eval_accuracy": ev["eval_accuracy"] if M.family_of(model).reports_accuracy else None,
      "total_flops": pos.flops,
      "train_seconds": pos.train_seconds,
      "compile_seconds": pos.compile_seconds,
      "transition_seconds": pos.transition_seconds,  # Operators at level changes (not compiles).
      "steps": pos.global_step,
      "examples": pos.examples,
      "epochs": pos.examples / max(info.num_train_examples, 1),  # Passes over the training split.
      "levels": len(plan.levels),
      "method": plan.method,
      "per_stage": per_stage,
      "cuts": pos.cuts,  # Adaptive stages that ended early: [stage, steps, extra target steps].
      "params_sha256": params_digest(params),
      "data": info.description,
      "num_train_examples": info.num_train_examples,
      # What each evaluation reads: data.max_eval_batches batches of the validation split, not all of it.
      "eval_examples": len(eval_batches) * eval_batches.global_batch,
      "num_eval_examples": info.num_eval_examples,
      "model": model.to_dict(),
  }
  if info.class_names:
    summary["class_names"] = list(info.class_names)
  if info.image_mean:
    summary["image_normalization"] = {"mean": list(info.image_mean), "std": list(info.image_std),
                                      "resize": data.resize}  # (False: smaller images were zero-padded.)
  return summary


def keep_tokenizer(info, workdir: str, is_main: bool) -> dict:
  """``{'tokenizer': ...}`` for a text run: the tokenizer copied into the workdir (a cache can be cleared; the main
  process copies it) and its special ids; ``{}`` for data without one."""
  if not info.tokenizer_path:
    return {}
  kept = os.path.join(workdir, "tokenizer.json")
  if is_main and os.path.isfile(info.tokenizer_path):
    shutil.copyfile(info.tokenizer_path, kept + ".tmp")
    os.replace(kept + ".tmp", kept)
  return {"tokenizer": {"path": kept, "eos_id": info.eos_id, "pad_id": info.pad_id, "mask_id": info.mask_id}}
