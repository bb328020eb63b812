"""A run's working directory is used by one run at a time: an advisory lock held for the run's lifetime.

The lock is ``fcntl.flock`` on ``<workdir>/.lock`` (one file per process of a multi-process run), so the kernel
releases it when the process ends in any way, SIGKILL included: a crashed run never leaves a stale lock, and the
same command started again resumes. A second run on a directory in use is refused at once, before it writes
anything.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time


class WorkdirLockedError(RuntimeError):
  """Another live process is running in this working directory."""


class WorkdirLock:
  """Takes the lock on construction (raising ``WorkdirLockedError`` if it is held); ``release()`` gives it back."""

  def __init__(self, workdir: str, process_index: int = 0):
    self._fd = None
    self.workdir = workdir
    self._existed = os.path.isdir(workdir)
    self._found_empty = not (self._existed and os.listdir(workdir))
    if os.path.exists(workdir) and not os.path.isdir(workdir):
      raise NotADirectoryError(f"--workdir={workdir} is a file, not a folder: name a folder (it is created if "
                               f"missing).")
    name = ".lock" if process_index == 0 else f".lock.{process_index}"
    self.path = os.path.join(workdir, name)
    try:
      os.makedirs(workdir, exist_ok=True)
      self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise PermissionError(f"Cannot write in --workdir={workdir} ({e.strerror}): a run keeps its checkpoints and "
                            f"metrics there. Make it writable, or choose another --workdir.") from None
    try:
      fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _read_holder(self._fd)
      os.close(self._fd)
      self._fd = None
      raise WorkdirLockedError(
          f"{workdir} is in use by another run{holder}. Wait for it to finish (or stop it), or choose another "
          f"--workdir; the same command resumes the run once the directory is free.") from None
    os.ftruncate(self._fd, 0)
    os.write(self._fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                   "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())

  def release(self, discard_unless: str | None = None) -> None:
    """Gives the lock back. With ``discard_unless`` (a file name), a workdir this lock found empty (or made) is
    emptied again first (removed, if the lock made it), unless that file is there: a run that stopped before it
    marked itself started leaves nothing behind. Done while the lock is held: no other run's files are touched."""
    if self._fd is not None and discard_unless and self._found_empty and \
        not os.path.exists(os.path.join(self.workdir, discard_unless)):
      _empty(self.workdir, self._existed)
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __del__(self):
    self.release()


def _read_holder(fd: int) -> str:
  try:
    info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    return f" (pid {info['pid']} on {info['host']}, since {info['since']})"
  except (OSError, ValueError, KeyError):
    return ""


def _empty(workdir: str, existed: bool) -> None:
  """Removes what was written in ``workdir``: the folder itself if it did not exist before, else its contents."""
  if not existed:
    shutil.rmtree(workdir, ignore_errors=True)
    return
  for entry in os.scandir(workdir):
    if entry.is_dir(follow_symlinks=False):
      shutil.rmtree(entry.path, ignore_errors=True)
    else:
      os.remove(entry.path)
