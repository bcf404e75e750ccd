"""`precision report FILE.gguf`: what a GGUF file holds, without a second checkpoint.

Its keys (the architecture's hyperparameters, the tokenizer's, `general.*`; long
arrays as their length), then every tensor with its ggml type, shape and bytes, and
the bytes per type: what llama.cpp will load, read through the `gguf` package.
"""

from __future__ import annotations

import argparse
import collections
import json

from .._checkpoint import _gguf
from ._output import _human, _table

__all__ = ["list_gguf"]


def list_gguf(args: argparse.Namespace) -> int:
    """Print the keys and tensors of the GGUF file `args.ref` (a table, or `--json`)."""
    try:
        keys, tensors = _gguf.contents(args.ref)
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "report of a GGUF file needs the gguf package; install it with pip install "
            "'precision[gguf]'",
            name="gguf",
        ) from None
    if args.json:
        rows = [{"name": n, "type": k, "shape": list(s), "bytes": b} for n, k, s, b in tensors]
        print(json.dumps({"keys": keys, "tensors": rows}, indent=2, default=str))
        return 0
    width = max((len(k) for k in keys), default=0)
    for key, value in keys.items():
        print(f"{key:<{width}}  {value}")
    print()
    shown = tensors if args.top is None else tensors[: args.top]
    table = [[n, k, "x".join(map(str, s)) or "scalar", _human(b)] for n, k, s, b in shown]
    print(_table(table, ["tensor", "type", "shape", "size"], right={3}))
    per: collections.Counter[str] = collections.Counter()
    for _, kind, _, size in tensors:
        per[kind] += size
    total = sum(per.values())
    parts = ", ".join(f"{kind} {_human(size)}" for kind, size in per.most_common())
    print(f"{len(tensors)} tensor(s), {_human(total)}: {parts}")
    return 0
