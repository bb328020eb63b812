"""Joining a multi-process run on JAX's distributed runtime, with bounded waits and one clear error.

Every process of a run calls ``initialize`` before any other JAX call: process 0 hosts the coordinator at
``coordinator_address`` (host:port), the others connect to it. Arguments left as None are read by JAX from its
environment (``JAX_COORDINATOR_ADDRESS``, or a cluster's variables such as SLURM's). On CPU the processes exchange
tensors over gloo. A coordinator that cannot be reached, or a process count that does not match, fails within
``timeout_s`` seconds, never hangs.
"""

from __future__ import annotations

import json
import socket
import time
import zlib

import jax
import numpy as np
from absl import logging


class DistributedError(RuntimeError):
  """The processes of a run could not form one distributed system."""


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, timeout_s: int = 120) -> None:
  """``jax.distributed.initialize`` with the project's checks and message."""
  if num_processes is not None and num_processes < 1:
    raise DistributedError(f"--num_processes must be >= 1, got {num_processes}.")
  if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
    raise DistributedError(f"--process_id={process_id} is not in [0, {num_processes}): give each of the "
                           f"{num_processes} processes its own id, 0 for the one that hosts the coordinator.")
  if timeout_s < 1:
    raise DistributedError(f"--distributed_timeout must be >= 1 second, got {timeout_s}.")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # Collectives between CPU processes.
  who = (f"process {process_id if process_id is not None else '?'} of "
         f"{num_processes if num_processes is not None else '?'}")
  where = coordinator_address or "(address from the environment)"
  if coordinator_address and process_id not in (None, 0):
    _wait_for_coordinator(coordinator_address, timeout_s, who)
  # JAX's runtime ends every process from C++ (no Python error to catch) when the processes never all register:
  # say beforehand what that abort means.
  logging.info("Joining the distributed run at %s as %s (waiting up to %d s). If the runtime aborts with 'detected "
               "fatal errors', a process is missing, died, or was started with another --num_processes.", where,
               who, timeout_s)
  try:
    jax.distributed.initialize(coordinator_address, num_processes, process_id, initialization_timeout=int(timeout_s),
                               heartbeat_timeout_seconds=max(10, int(timeout_s)),
                               shutdown_timeout_seconds=max(10, int(timeout_s)))
  except Exception as e:  # The runtime raises several types (RuntimeError, XlaRuntimeError, ValueError).
    text = " ".join(str(e).split())[:400]
    raise DistributedError(
        f"Could not join the distributed run at {coordinator_address or '(address from the environment)'} as {who} "
        f"within {timeout_s} s ({type(e).__name__}: {text}). Check that process 0 is running and listening at that "
        f"address, that every process got the same --num_processes, and that each --process_id is unique.") from None
  _check_agreement(num_processes, process_id)
  logging.info("Joined the distributed run: process %d of %d, %d local / %d global devices.", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())


def _wait_for_coordinator(address: str, timeout_s: int, who: str) -> None:
  """Waits until process 0's coordinator accepts connections (a TCP connect, nothing sent), at most ``timeout_s``."""
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise DistributedError(f"--coordinator_address={address!r} must be host:port, e.g. 127.0.0.1:12355.")
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      socket.create_connection((host, int(port)), timeout=min(5.0, timeout_s)).close()
      return
    except OSError as e:
      if time.monotonic() >= deadline:
        raise DistributedError(f"No coordinator answers at {address} after {timeout_s} s ({e.strerror or e}); {who} "
                               f"cannot join. Start process 0 (--process_id=0) with the same --coordinator_address, "
                               f"or fix the address.") from None
      time.sleep(0.5)


def _check_agreement(num_processes: int | None, process_id: int | None) -> None:
  """Every process got the same --num_processes, and its --process_id is the one the runtime gave it (one small
  all-gather over JAX's own collectives, so all processes fail together with the same message)."""
  from jax.experimental import multihost_utils
  mine = np.array([-1 if num_processes is None else num_processes, -1 if process_id is None else process_id])
  everyone = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 2)
  counts = sorted({int(n) for n in everyone[:, 0] if n >= 0})
  if counts and counts != [jax.process_count()]:
    raise DistributedError(f"The processes disagree on --num_processes (given {counts}; the run has "
                           f"{jax.process_count()}, the count process 0 was given). Start every process with the "
                           f"same --num_processes.")
  ids = [int(i) for i in everyone[:, 1]]
  if all(i >= 0 for i in ids) and ids != list(range(jax.process_count())):
    raise DistributedError(f"The --process_id values {ids} do not match the processes' ranks; give each process a "
                           f"unique id in [0, {jax.process_count()}).")


def check_same_config(config: dict) -> None:
  """Every process of the run was given the same config (``run_config.config_json``, the progress bar and
  TensorBoard aside: process 0's alone): one all-gather of a checksum per key, so all processes refuse together,
  naming the keys (a config that one process refuses by itself ends that process; JAX's runtime then stops the
  others at its heartbeat timeout). Processes with different learning rates trained apart silently, and different meshes hung."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils

  from multilevel.tree import flatten
  flat = {k: v for k, v in flatten(config).items() if k not in ("progress", "tensorboard")}
  names = sorted(flat)
  counts = np.asarray(multihost_utils.process_allgather(np.array([len(names)], np.int32))).reshape(-1)
  if len(set(counts.tolist())) > 1:
    raise ValueError("The processes were started with configs that hold different keys (another config "
                           "file?). Start every process with the same command, apart from --process_id.")
  sums = np.array([zlib.crc32(f"{k}={json.dumps(flat[k], sort_keys=True)}".encode()) for k in names], np.uint32)
  everyone = np.asarray(multihost_utils.process_allgather(sums.view(np.int32))).reshape(len(counts), -1)
  differ = [names[j].replace("/", ".") for j in range(len(names)) if len(set(everyone[:, j].tolist())) > 1]
  if differ:
    raise ValueError(f"The processes were started with different settings of {', '.join(differ[:8])}: every "
                           f"process of a run trains the same model on its share of each batch. Start every process "
                           f"with the same command, apart from --process_id.")
