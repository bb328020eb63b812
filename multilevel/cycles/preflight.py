"""Checks a run makes before it writes anything: the compute dtype against the backend, the global batch against
the processes, devices and gradient-accumulation microbatches, and how many devices a run uses by default."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from multilevel.typed_config import ConfigError


def check_dtype(model) -> None:
  """Refuses a compute dtype the backend cannot multiply in: XLA's CPU backend has no float16 dot (it fails at the
  first compilation, after the run has written its first checkpoint)."""
  if jax.default_backend() == "cpu" and jnp.dtype(model.dtype) == jnp.float16:
    raise ConfigError(f"model.dtype={model.dtype}: XLA's CPU backend has no float16 matrix multiply. On a CPU use "
                      f"float32 or bfloat16 (float16 runs on GPUs).")


def check_batch(train, mesh) -> None:
  """The global batch must split evenly over processes, devices and gradient-accumulation microbatches."""
  devices, procs = mesh.devices.size, jax.process_count()
  micro = train.batch_size // train.grad_accum
  if train.batch_size % procs or micro % devices:
    raise ConfigError(
        f"train.batch_size={train.batch_size} with train.grad_accum={train.grad_accum} gives microbatches of "
        f"{micro} rows, which do not split over the {devices} devices ({procs} process{'es' if procs > 1 else ''}) "
        f"of the mesh; choose a batch size that is a multiple of grad_accum x {devices} (e.g. "
        f"{train.grad_accum * devices * max(1, micro // devices)}), or "
        + ("a train.mesh over fewer devices." if train.mesh else "set train.num_devices."))


def default_devices(mesh: str) -> int | None:
  """Devices of a run whose train.num_devices is 0: as many as the mesh names, else all of them, except one in a
  single CPU process (fake CPU devices only slow a run down, and their all-reduce can deadlock)."""
  if mesh:
    sizes = [part.partition(":")[2].strip() for part in mesh.split(",")]
    return int(np.prod([int(x) for x in sizes if x.isdigit()] or [1]))
  return 1 if jax.default_backend() == "cpu" and jax.process_count() == 1 else None
