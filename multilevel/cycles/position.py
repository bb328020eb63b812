"""Where a run stands: one typed record that is also the checkpoint's meta schema."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class StageStats:
  """What one stage has cost so far."""

  stage: int
  steps: int = 0
  flops: float = 0.0
  train_seconds: float = 0.0


@dataclasses.dataclass
class RunPosition:
  """The run's position and counters. ``to_meta``/``from_meta`` are the checkpoint's meta schema: every field is
  saved with each checkpoint and restored on resume, so a resumed run continues exactly where it stopped.

  Seconds: ``train_seconds`` counts training steps only; ``compile_seconds`` the ahead-of-time compilation of
  steps and transitions; ``transition_seconds`` the level-change operators' run time (part of the wall-clock cost).
  """

  stage: int = 0  # Index of the stage being trained (or just entered).
  stage_step: int = 0  # Steps done in that stage.
  global_step: int = 0  # Steps done in the whole run.
  examples: int = 0
  flops: float = 0.0
  train_seconds: float = 0.0
  compile_seconds: float = 0.0
  transition_seconds: float = 0.0
  per_stage: list[StageStats] = dataclasses.field(default_factory=list)
  save_id: int = 0  # Id of the next checkpoint to write.
  # An adaptive stage's evaluations so far, [stage step, stage FLOPs, eval loss], read by its stop rule; and the
  # stages such a rule ended early, [stage, steps, extra steps given to the target]: the plan is rebuilt from them.
  stage_evals: list = dataclasses.field(default_factory=list)
  cuts: list = dataclasses.field(default_factory=list)

  # Fields added after checkpoints of earlier versions were written: restored as their defaults when absent.
  OPTIONAL = ("stage_evals", "cuts")

  def stats(self, stage: int) -> StageStats:
    """The counters of ``stage``, created on first use (stages are entered in order)."""
    while len(self.per_stage) <= stage:
      self.per_stage.append(StageStats(len(self.per_stage)))
    return self.per_stage[stage]

  def count_step(self, stage: int, flops: float, examples: int) -> None:
    self.stage_step += 1
    self.global_step += 1
    self.flops += flops
    self.examples += examples
    stats = self.stats(stage)
    stats.steps += 1
    stats.flops += flops

  def add_train_seconds(self, stage: int, seconds: float) -> None:
    self.train_seconds += seconds
    self.stats(stage).train_seconds += seconds

  def enter(self, stage: int) -> None:
    self.stage, self.stage_step = stage, 0
    self.stage_evals = []

  def to_meta(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_meta(cls, meta: dict) -> "RunPosition":
    names = {f.name for f in dataclasses.fields(cls)}
    missing = sorted(names - set(meta) - set(cls.OPTIONAL))
    if missing:
      raise KeyError(f"the checkpoint's meta lacks {missing}")
    values = {k: meta[k] for k in names if k in meta}
    values["per_stage"] = [StageStats(**s) for s in meta["per_stage"]]
    return cls(**values)
