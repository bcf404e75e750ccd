"""The precision rules of docs/design.md §4 ("Storage and compute"), in one place.

See README.md beside this file for the design in prose.
"""

from ._kinds import RULES as RULES
from ._kinds import rule_for as rule_for
from ._rules import Val as Val
from ._rules import in_compute_format as in_compute_format
from ._state import Context as Context
from ._state import State as State
from ._state import Stored as Stored
from ._state import View as View
from ._state import join as join

__all__ = ["RULES", "Context", "State", "Stored", "Val", "in_compute_format", "join", "rule_for"]
