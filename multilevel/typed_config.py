"""Typed config sections: frozen dataclasses that hold each default once, built from a ``ConfigDict`` or a dict.

The command line keeps ``ml_collections.ConfigDict`` and ``--config.a.b=`` overrides; the library reads only typed
sections, converted once at the boundary by ``section_from``: missing keys take the dataclass defaults, unknown keys
and values of the wrong type are refused with a message that names the key and lists the valid ones. A section calls
``check_fields`` in its ``__post_init__``, so a section built directly in code is checked the same way.
"""

from __future__ import annotations

import dataclasses
import numbers
import types
import typing
from typing import Any, Mapping


class ConfigError(ValueError):
  """A config value is missing, unknown or out of range."""


class ConfigTypeError(ConfigError, TypeError):
  """A config value has the wrong type."""


def _expected(hint: Any) -> str:
  if hint is bool:
    return "bool"
  if hint is int:
    return "int"
  if hint is float:
    return "float (or int)"
  if hint is str:
    return "str"
  if typing.get_origin(hint) in (tuple, list):
    args = typing.get_args(hint)
    return f"a list of {_expected(args[0]) if args else 'values'}"
  if _is_union(hint):
    return " or ".join(_expected(o) for o in typing.get_args(hint) if o is not type(None))
  if dataclasses.is_dataclass(hint):
    return "a config section"
  return getattr(hint, "__name__", str(hint))


def _is_union(hint: Any) -> bool:
  return isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union


def _convert(value: Any, hint: Any, key: str):
  """``(True, converted)`` when ``value`` fits ``hint``, else ``(False, None)``."""
  if hint is Any:
    return True, value
  if _is_union(hint):
    for option in typing.get_args(hint):
      if option is type(None):
        if value is None:
          return True, None
        continue
      ok, out = _convert(value, option, key)
      if ok:
        return True, out
    return False, None
  if dataclasses.is_dataclass(hint):
    return True, section_from(hint, value, key)
  if typing.get_origin(hint) in (tuple, list):
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
      return False, None
    args = typing.get_args(hint)
    inner = args[0] if args else Any
    out = []
    for v in value:
      ok, x = _convert(v, inner, key)
      if not ok:
        return False, None
      out.append(x)
    return True, tuple(out)
  if hint is bool:
    return (True, value) if isinstance(value, bool) else (False, None)
  if hint is int:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    return (True, int(value)) if ok else (False, None)
  if hint is float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    return (True, float(value)) if ok else (False, None)
  if hint is str:
    return (True, value) if isinstance(value, str) else (False, None)
  return True, value


def coerce(value: Any, hint: Any, key: str) -> Any:
  """``value`` as the annotated type ``hint`` (ints to floats, lists to tuples), or a ``ConfigTypeError`` naming the
  key, the value and the expected type."""
  ok, out = _convert(value, hint, key)
  if not ok:
    raise ConfigTypeError(f"{key} = {value!r} has the wrong type {type(value).__name__}: expected "
                          f"{_expected(hint)}.")
  return out


def check_fields(section, name: str) -> None:
  """Coerces every field of the frozen dataclass instance ``section`` in place (for its ``__post_init__``)."""
  hints = typing.get_type_hints(type(section))
  for f in dataclasses.fields(section):
    object.__setattr__(section, f.name, coerce(getattr(section, f.name), hints[f.name], f"{name}.{f.name}"))


def as_mapping(c: Any, what: str = "config section") -> dict:
  """A plain dict of a ``ConfigDict``, a mapping, or a dataclass instance (one level deep)."""
  if c is None:
    return {}
  if dataclasses.is_dataclass(c) and not isinstance(c, type):
    return {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
  if hasattr(c, "to_dict"):
    return dict(c.to_dict())
  if isinstance(c, Mapping):
    return dict(c)
  raise ConfigTypeError(f"The {what} must be a {what}, a ConfigDict or a dict, got {type(c).__name__}.")


def section_from(cls, c: Any, section: str):
  """An instance of the dataclass ``cls`` from the config section ``c`` (ConfigDict, dict or ``cls`` itself).

  Keys of ``c`` missing from ``cls`` raise ``ConfigError("unknown key ...")`` listing the valid keys of the
  section; present keys are checked against the field types (ints are accepted where floats are expected).
  """
  if isinstance(c, cls):
    return c
  hook = getattr(cls, "__section_from__", None)  # A section that also takes keys it does not declare as fields.
  if hook is not None:
    return hook(c, section)
  return fields_from(cls, as_mapping(c, cls.__name__), section)


def fields_from(cls, values: Mapping[str, Any], section: str, more_keys: tuple[str, ...] = ()):
  """``section_from``'s plain path: ``cls`` from the mapping ``values`` of its fields (``more_keys``: other keys the
  section takes, listed among the valid ones when a key is unknown)."""
  names = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(values) - set(names))
  if unknown:
    raise ConfigError(f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(f'{section}.{k}' for k in unknown)}"
                      f"; the valid keys are {', '.join(names + list(more_keys))}.")
  hints = typing.get_type_hints(cls)
  return cls(**{k: coerce(v, hints[k], f"{section}.{k}") for k, v in values.items()})
