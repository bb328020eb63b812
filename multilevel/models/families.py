"""The registered model families: one module file each (``bert.py``, ``gpt.py``, ``deit.py``) on the shared core.

Each family declares its axis-role table (``axes.py``: which space each axis of each parameter lives in; all the
operators know of a model) and its facts (``family.py``). ``FAMILY`` maps a family name to its ``Family`` record.
"""

from __future__ import annotations

from multilevel.models import bert, deit, gpt  # noqa: F401  (each module registers its family)
from multilevel.models.bert import BERT_AXES, Bert
from multilevel.models.deit import DEIT_AXES, Deit
from multilevel.models.family import REGISTRY as FAMILY
from multilevel.models.family import Family, family_of
from multilevel.models.gpt import GPT_AXES, Gpt

__all__ = ["FAMILY", "Family", "family_of", "Bert", "Gpt", "Deit", "BERT_AXES", "GPT_AXES", "DEIT_AXES"]
