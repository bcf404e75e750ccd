"""The rule of each kind of primitive: the one table `precision.apply` dispatches by.

A primitive's kind comes from `precision._primitives` (the one table of
primitives); its rule from `RULES` here. Contractions have their own rule
(`_contractions.contraction_rule`); every other kind the walk does not evaluate
itself takes the default rule (`_rules.default_rule`), which rounds floating
outputs unless the kind is a move or grid-preserving. A primitive the table does
not hold is named in a `PrecisionFallbackWarning`, once per process, and takes the
default rule.
"""

from __future__ import annotations

import warnings
from types import MappingProxyType

from .. import _primitives
from .._errors import PrecisionFallbackWarning
from ._contractions import contraction_rule
from ._rules import Rule, default_rule

__all__ = ["RULES", "rule_for"]

RULES: MappingProxyType[_primitives.Kind, Rule] = MappingProxyType(
    {
        kind: contraction_rule if kind == "contraction" else default_rule
        for kind in _primitives.KINDS
        if kind != "walked"  # (the walk evaluates their jaxprs itself)
    }
)

_WARNED: set[str] = set()


def rule_for(name: str) -> Rule:
    """The rule of the primitive named `name` (the walk evaluates `walked` ones itself)."""
    kind = _primitives.kind_of(name)
    if kind is None:
        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(
                f"precision.apply: primitive `{name}` is not in precision's table of "
                "primitives (new in this JAX?); it is computed on its inputs' values and "
                "its floating outputs are rounded onto the compute format. Please report "
                "it so that it gets its kind.",
                PrecisionFallbackWarning,
                stacklevel=2,
            )
        return default_rule
    return RULES[kind]
