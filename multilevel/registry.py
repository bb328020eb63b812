"""A named registry: model families, training methods. ``register`` refuses a name twice; ``get`` names the choices."""

from __future__ import annotations

from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """A mapping from ``item.name`` to ``item``, filled once at import time by the modules that define the items."""

  def __init__(self, what: str, config_key: str):
    self._what, self._key = what, config_key
    self._items: dict[str, T] = {}

  def register(self, item: T, replace: bool = False) -> T:
    """Adds ``item`` under ``item.name``; ``replace=True`` lets a new definition take a registered name (a module
    re-run in a notebook), which is refused otherwise."""
    if item.name in self._items and not replace:
      raise ValueError(f"{self._what} {item.name!r} is registered twice (re-running its module, e.g. in a notebook? "
                       f"register it with replace=True).")
    self._items[item.name] = item
    return item

  def get(self, name: str) -> T:
    if name not in self._items:
      raise ValueError(f"Unknown {self._what} {self._key}={name!r}; registered: {', '.join(sorted(self._items))}.")
    return self._items[name]

  def __contains__(self, name) -> bool:
    return name in self._items

  def __getitem__(self, name: str) -> T:
    return self.get(name)

  def __iter__(self) -> Iterator[str]:
    return iter(sorted(self._items))

  def __len__(self) -> int:
    return len(self._items)

  def values(self):
    return [self._items[k] for k in sorted(self._items)]

  def items(self):
    return [(k, self._items[k]) for k in sorted(self._items)]
