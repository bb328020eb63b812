"""Typed config sections: frozen dataclasses that hold each default once, built from a ``ConfigDict`` or a dict.

The command line keeps ``ml_collections.ConfigDict`` and ``--config.a.b=`` overrides; the library reads only typed
sections, converted once at the boundary by ``section_from``: missing keys take the dataclass defaults, unknown keys
and values of the wrong type are refused with a message that names the key and lists the valid ones.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping


class ConfigError(ValueError):
  """A config value is missing, unknown, of the wrong type or out of range."""


def as_mapping(c: Any) -> dict:
  """A plain dict of a ``ConfigDict``, a mapping, or a dataclass instance (one level deep)."""
  if c is None:
    return {}
  if dataclasses.is_dataclass(c) and not isinstance(c, type):
    return {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
  if hasattr(c, "to_dict"):
    return dict(c.to_dict())
  if isinstance(c, Mapping):
    return dict(c)
  raise ConfigError(f"Expected a config section (ConfigDict, dict or dataclass), got {type(c).__name__}.")


def _coerce(value: Any, hint: Any, key: str) -> Any:
  """``value`` as the annotated type ``hint``, or a ConfigError naming the key."""
  origin = typing.get_origin(hint)
  args = typing.get_args(hint)
  if hint is Any:
    return value
  if dataclasses.is_dataclass(hint):
    return section_from(hint, value, key)
  if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
    errors = []
    for option in args:
      if option is type(None):
        if value is None:
          return None
        continue
      try:
        return _coerce(value, option, key)
      except ConfigError as e:
        errors.append(str(e))
    raise ConfigError(errors[0] if errors else f"{key}: {value!r} is not allowed.")
  if origin in (tuple, list):
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
      raise ConfigError(f"{key} must be a list, got {value!r}.")
    inner = args[0] if args else Any
    return tuple(_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
  if hint is bool:
    if isinstance(value, bool):
      return value
    raise ConfigError(f"{key} must be true or false, got {value!r}.")
  if hint is int:
    if isinstance(value, bool) or not isinstance(value, int):
      if isinstance(value, float) and value.is_integer():
        return int(value)
      raise ConfigError(f"{key} must be an integer, got {value!r}.")
    return int(value)
  if hint is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"{key} must be a number, got {value!r}.")
    return float(value)
  if hint is str:
    if not isinstance(value, str):
      raise ConfigError(f"{key} must be a string, got {value!r}.")
    return value
  return value


def section_from(cls, c: Any, section: str):
  """An instance of the dataclass ``cls`` from the config section ``c`` (ConfigDict, dict or ``cls`` itself).

  Keys of ``c`` missing from ``cls`` raise ``ConfigError("unknown key ...")`` listing the valid keys of the
  section; present keys are checked against the field types (ints are accepted where floats are expected).
  """
  if isinstance(c, cls):
    return c
  values = as_mapping(c)
  names = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(values) - set(names))
  if unknown:
    raise ConfigError(f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(f'{section}.{k}' for k in unknown)}"
                      f"; valid keys of '{section}': {', '.join(names)}.")
  hints = typing.get_type_hints(cls)
  kwargs = {k: _coerce(v, hints[k], f"{section}.{k}") for k, v in values.items()}
  return cls(**kwargs)
