"""Files written whole or not at all: a reader (another host, a resumed run) never sees half of one.

``atomic_path(path)`` yields a temporary path in the same folder; the caller writes it, and it is renamed onto
``path`` when the block ends, or removed when the block raises. ``write_text_atomic`` and ``write_json_atomic`` are
the two common cases.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str, mode: int = 0o644) -> Iterator[str]:
  """A temporary path beside ``path``, renamed onto it (with permissions ``mode``) if the block succeeds."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.tmp-")
  os.close(fd)
  try:
    yield tmp
    os.chmod(tmp, mode)  # mkstemp makes 0600; caches and run directories may be shared.
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)
    raise


def write_text_atomic(path: str, text: str) -> None:
  with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    f.write(text)


def write_json_atomic(path: str, obj: Any) -> None:
  """``obj`` as indented JSON with sorted keys and a final newline."""
  write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
