"""Training: objectives, optimizer, the jitted data-parallel step, and FLOPs accounting."""

from multilevel.train.flops import forward_flops_per_example, train_flops_per_step
from multilevel.train.objectives import OBJECTIVES, ObjectiveConfig, mlm_corrupt, objective_of, tokens_per_example
from multilevel.train.optim import LrSchedule, OptimConfig, carry_moments, decay_mask
from multilevel.train.evaluate import Evaluator
from multilevel.train.sharding import make_mesh, param_shardings, parse_mesh, replicated
from multilevel.train.step import (StepConfig, Steps, TrainState, build_steps, eval_step, init_params, put_batch,
                                   state_shardings, train_step_fn)
