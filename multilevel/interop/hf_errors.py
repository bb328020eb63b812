"""Errors of the Hugging Face import/export (``multilevel.interop.hf``): every one is an ``HFInteropError``."""

from __future__ import annotations


class HFInteropError(ValueError):
  """Base class of every import/export error."""


class UnsupportedArchitectureError(HFInteropError):
  """The checkpoint is of an architecture we have no model for."""


class UnsupportedConfigError(HFInteropError):
  """The architecture is supported but one of its settings is not (activation, position embeddings, ...)."""


class MissingTensorError(HFInteropError):
  """A tensor our model needs is not in the checkpoint."""


class UnexpectedTensorError(HFInteropError):
  """The checkpoint holds a tensor that maps to nothing in our model."""


class TensorShapeError(HFInteropError):
  """A tensor's shape does not fit the configuration."""


def _names(keys, limit: int = 12) -> str:
  keys = sorted(keys)
  more = f" ... and {len(keys) - limit} more" if len(keys) > limit else ""
  return ", ".join(keys[:limit]) + more
