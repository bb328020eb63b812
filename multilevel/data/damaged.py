"""Errors that name a damaged local text file (.txt/.md, .json/.jsonl, .parquet) and say what to do about it.

HF ``datasets`` reads the files of ``cfg.files`` and, when one is damaged, raises whatever pyarrow, ``json`` or the
codec raised, often without the file's name. Only then does ``files_error`` look at each file itself and report the
first one that cannot be read, with the line and the fix; the happy path pays nothing.
"""

from __future__ import annotations

import json
from typing import Iterator

LEAVE_OUT = "or leave the file out of data.files"


def why_unreadable(path: str, kind: str) -> tuple[str, str] | None:
  """(what is wrong, what to do) for one file read as ``kind`` ('text', 'json' or 'parquet'); None if it reads."""
  if kind == "parquet":
    import pyarrow.parquet as pq
    try:
      pq.read_table(path)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError... for a damaged file.
      return f"it is not a readable Parquet file ({type(e).__name__}: {e})", "re-create it"
    return None
  with open(path, "rb") as f:
    head = f.read(4)
    for bom, codec in ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe", "utf-16"),
                       (b"\xfe\xff", "utf-16")):
      if head.startswith(bom):
        return (f"it is {codec.upper()} text (it starts with a {codec.upper()} byte-order mark)",
                f"convert it to UTF-8 (iconv -f {codec} -t utf-8)")
    f.seek(0)
    for number, line in enumerate(f, 1):
      try:
        line.decode("utf-8")
      except UnicodeDecodeError as e:
        return (f"line {number} is not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1})",
                "convert it to UTF-8 (`file -i` names its encoding; for Latin-1, iconv -f latin1 -t utf-8)")
  if kind == "json":
    with open(path, encoding="utf-8") as f:
      text = f.read()
    whole = _json_error(text)
    if whole is None:
      return None  # One JSON document.
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if lines and _json_error(lines[0][1]) is None:  # JSON lines: name the first line that is not JSON.
      for number, line in lines:
        e = _json_error(line)
        if e is not None:
          return f"line {number} is not valid JSON ({e.msg}: column {e.colno})", "fix or remove that line"
      return None
    return f"it is not valid JSON ({whole.msg}: line {whole.lineno}, column {whole.colno})", "fix it"
  return None


def _json_error(text: str) -> json.JSONDecodeError | None:
  try:
    json.loads(text)
  except json.JSONDecodeError as e:
    return e
  return None


def files_error(paths: list[str], kind: str, error: BaseException) -> ValueError:
  """The error to raise when reading ``paths`` failed with ``error``: the damaged file named, else the raw cause."""
  for path in paths:
    found = why_unreadable(path, kind)
    if found:
      what, fix = found
      return ValueError(f"The {kind} file {path} cannot be read: {what}. {fix[0].upper()}{fix[1:]}, {LEAVE_OUT}.")
  return ValueError(f"Reading the {kind} file(s) {paths[0]}{', ...' if len(paths) > 1 else ''} failed "
                    f"({type(error).__name__}: {error}); check them, {LEAVE_OUT}.")


def named_on_failure(rows: Iterator[dict], paths: list[str], kind: str) -> Iterator[dict]:
  """``rows`` unchanged; a failure while reading them becomes ``files_error``."""
  try:
    yield from rows
  except Exception as e:  # pyarrow, json, codecs and datasets each raise their own types.
    raise files_error(paths, kind, e) from None
