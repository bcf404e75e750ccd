"""`precision.apply`: the interpreter that runs JAX functions under the rules.

`_interpreter` walks a jaxpr, leaving every format decision to the rules of
`precision._compute`; `_apply` holds the wrapper, its cache and how results
become Tensors again.
"""

from ._apply import apply as apply

__all__ = ["apply"]
