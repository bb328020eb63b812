"""The registered model families: one module file each (``bert.py``, ``gpt.py``, ``deit.py`` on the shared core,
``llama.py`` with its own block).

Each family declares its axis-role table (``axes.py``: which space each axis of each parameter lives in; all the
operators know of a model) and its facts (``family.py``). ``FAMILY`` maps a family name to its ``Family`` record.
"""

from __future__ import annotations

from multilevel.models import bert, deit, gpt, llama  # noqa: F401  (each module registers its family)
from multilevel.models.bert import BERT_AXES, Bert
from multilevel.models.deit import DEIT_AXES, Deit
from multilevel.models.family import REGISTRY as FAMILY
from multilevel.models.family import Family, family_of
from multilevel.models.gpt import GPT_AXES, Gpt
from multilevel.models.llama import LLAMA_AXES, Llama

__all__ = ["FAMILY", "Family", "family_of", "Bert", "Gpt", "Deit", "Llama", "BERT_AXES", "GPT_AXES", "DEIT_AXES",
           "LLAMA_AXES"]
