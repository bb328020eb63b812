"""The multi-level operators as pure functions on parameter trees: coalescing (``coalesce``, ``decoalesce``),
interpolation (``interpolate``) and symmetry breaking (``split_noise``, ``fresh_layers``), all driven by a ``LevelMap``.

``LevelMap`` (``mapping.py``) and ``GroupMap`` (``groups.py``) also hold the public primitives the operators are built from.
"""

from multilevel.models import check_params as check_matches_config
from multilevel.operators.coalescing import coalesce, decoalesce
from multilevel.operators.finite import require_finite
from multilevel.operators.interpolation import interpolate
from multilevel.operators.groups import DEPTH_MODES, GroupMap, default_depth_groups, default_width_groups
from multilevel.operators.mapping import DEPTH_GROWTH, ChainError, LevelMap, make_chain, make_mapping
from multilevel.operators.symmetry import fresh_layers, split_noise
from multilevel.tree import check_same_structure, flatten, unflatten

__all__ = ["coalesce", "decoalesce", "interpolate", "split_noise", "fresh_layers", "make_mapping", "make_chain",
           "ChainError", "LevelMap", "GroupMap", "DEPTH_MODES", "DEPTH_GROWTH", "default_width_groups",
           "default_depth_groups", "check_matches_config", "check_same_structure", "flatten", "unflatten",
           "require_finite"]
