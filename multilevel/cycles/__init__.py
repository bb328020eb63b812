"""The V-cycle: the schedule as data (``schedule``) and the driver that runs it in one process (``driver``)."""

from multilevel.cycles.schedule import FINAL_SCHEDULES, OPT_POLICIES, Plan, Stage, build_plan
