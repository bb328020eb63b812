"""Training methods as data and the driver that runs them.

A method is a plan builder plus its transitions (``plan.Method``), registered by name (``cycle.method``); the
V-cycle (``vcycle.py``; scratch is its one-level plan) is the first; ``stack.py`` (G_stack, StackBERT) and ``mslt.py``
(MSLT), ``ligo.py`` (LiGO), ``msg.py`` (MSG) and ``core.py``
(CoRe) follow; ``config.py`` gathers their options into the ``cycle`` section. ``driver.train_and_evaluate`` runs
any of them.
"""

from multilevel.cycles import core, ligo, msg, mslt, stack, vcycle  # noqa: F401  (each registers its methods)
from multilevel.cycles.config import FINAL_SCHEDULES, OPT_POLICIES, CycleConfig, build_plan
from multilevel.cycles.plan import METHODS, Method, Plan, Stage, Transition, method_of, register_method

__all__ = ["METHODS", "Method", "Plan", "Stage", "Transition", "method_of", "register_method", "CycleConfig",
           "build_plan", "FINAL_SCHEDULES", "OPT_POLICIES"]
