"""One line for an expected error in the entry scripts: ``error: ...`` on stderr and exit status 1, with ``--debug``
(where a script defines it) showing the Python traceback instead."""

import os
import sys
from typing import Callable


def report(message: str) -> None:
  """Prints ``error: message`` to stderr."""
  print(f"error: {message}", file=sys.stderr, flush=True)


def fail(message: str) -> None:
  """Prints ``error: message`` to stderr and exits with status 1."""
  report(message)
  sys.exit(1)


def one_line(main: Callable, expected: tuple, debug: Callable[[], bool] = lambda: False,
             interrupted: str = "") -> Callable:
  """``main`` for ``absl.app.run`` with the ``expected`` exception types reported by ``fail`` (an absl
  ``UsageError`` among them prints its message alone, not the script's usage text); ``debug()`` true re-raises.
  With ``interrupted``, Ctrl-C prints ``interrupted: <that>`` and exits with status 130 instead of a traceback."""
  def wrapped(argv):
    try:
      return main(argv)
    except expected as e:
      if debug():
        raise
      fail(e.args[0] if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) else str(e))
    except KeyboardInterrupt:
      if debug() or not interrupted:
        raise
      print(f"interrupted: {interrupted}", file=sys.stderr, flush=True)
      sys.exit(130)
  return wrapped


def config_folder_on_path(argv: list[str]) -> None:
  """Puts the folder of a ``--config`` file of the user's first on ``sys.path``, as Python does for a script, so
  that the config file can import a module beside it (a method of their own: README, "Writing a method")."""
  ours = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
  for i, arg in enumerate(argv[1:], 1):
    value = arg.split("=", 1)[1] if arg.startswith("--config=") else (
        argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None)
    if value:
      folder = os.path.dirname(os.path.abspath(os.path.expanduser(value.split(":", 1)[0])))
      if folder != ours and folder not in sys.path:
        sys.path.insert(0, folder)
