"""A run in a subprocess with fake CPU devices, for the sharding tests: ``python -m tests.sharded_worker '<json>'``.

The JSON names the workdir, the config overrides and the number of levels; the worker trains with the real driver
and prints one JSON line: the final eval loss, the params digest, and for every sharded parameter and Adam moment its
global shape and the shape of each device's shard.
"""

import json
import sys

from multilevel.cycles.driver import Runner
from multilevel.tree import flatten
from tests.engine_util import tiny_config


def main(spec: dict) -> dict:
  runner = Runner(tiny_config("gpt", levels=spec.get("levels", 2), **spec.get("overrides", {})), spec["workdir"])
  with runner:
    summary = runner.run()
  state = runner.state
  shards = {}
  trees = {"params": state.params}
  for i, s in enumerate(x for x in _leaves(state.opt_state) if hasattr(x, "mu")):
    trees[f"mu{i}"], trees[f"nu{i}"] = s.mu, s.nu
  for tree_name, tree in trees.items():
    for name, x in flatten(tree).items():
      shards[f"{tree_name}/{name}"] = {"shape": list(x.shape), "spec": str(x.sharding.spec),
                                       "shards": sorted({tuple(s.data.shape) for s in x.addressable_shards})}
  return {"loss": summary["final_eval_loss"], "digest": summary["params_sha256"], "steps": summary["steps"],
          "devices": int(runner.mesh.devices.size), "shards": shards}


def _leaves(opt_state):
  import jax
  import optax
  return jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))


if __name__ == "__main__":
  print("RESULT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
