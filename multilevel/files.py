"""Files written whole or not at all: a reader (another host, a resumed run) never sees half of one.

``atomic_path(path)`` yields a temporary path in the same folder; the caller writes it, and it is renamed onto
``path`` when the block ends, or removed when the block raises. ``write_text_atomic`` and ``write_json_atomic`` are
the two common cases. ``atomic_folder(path)`` does the same for a folder of files written together.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
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


@contextlib.contextmanager
def atomic_folder(path: str, mode: int = 0o755) -> Iterator[str]:
  """A temporary folder beside ``path``, renamed onto it (with permissions ``mode``) if the block succeeds, removed
  with its contents if the block raises. If ``path`` exists by then (another writer finished first), it is kept and
  the temporary folder dropped. A writer killed on the way leaves only a ``.<name>.tmp-*`` folder, which
  ``remove_stale_temporaries`` clears later."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=folder, prefix=f".{os.path.basename(path)}.tmp-")
  try:
    yield tmp
    os.chmod(tmp, mode)  # mkdtemp makes 0700; caches may be shared.
    try:
      os.rename(tmp, path)  # atomic; refused when path is a folder with files in it
    except OSError:
      if not os.path.isdir(path):
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def remove_stale_temporaries(path: str, older_than_s: float = 3600.0) -> None:
  """Removes the temporary files and folders of ``path`` that killed writers left, once they are ``older_than_s``
  seconds old (a live writer is never that long between writes)."""
  folder, name = os.path.split(os.path.abspath(path))
  now = time.time()
  with contextlib.suppress(FileNotFoundError):
    for entry in os.scandir(folder):
      if entry.name.startswith(f".{name}.tmp-") and now - entry.stat(follow_symlinks=False).st_mtime > older_than_s:
        if entry.is_dir(follow_symlinks=False):
          shutil.rmtree(entry.path, ignore_errors=True)
        else:
          with contextlib.suppress(FileNotFoundError):
            os.remove(entry.path)
