"""How good is `precision.explain`'s predicted time? Predicted against measured.

Usage:
    python benchmarks/explain.py            # 24 shapes (64^3 .. 4096^3) x 3 paths, 2 models
    python benchmarks/explain.py --quick    # shapes up to 1024, small models (a minute)
    python benchmarks/explain.py --json out.json

Every row is one program: a product `x @ w` of shape (m, k) x (k, n), or a
model's forward pass (the GPT-2-small-like decoder and ResNet-18 of
`benchmarks/models.py`), under one path:

- `float32`: float32 weights, float32 compute;
- `int8`: int8 weights (per output channel), `contract="int8"` (W8A8: s8 x s8 dots);
- `int4/bf16`: int4 weights (blocks of 32), `compute="bfloat16"`.

For each row, `precision.explain(..., measure=True)` predicts the time of
one call (on a CPU from a one-off measurement of this machine; on known
accelerators from the datasheet table), and the same program is timed
(fastest of repeated calls, the statistic the prediction models). The
table prints measured / predicted; the target is within 1.5x either way
for at least 80% of rows. It also prints the predicted speed-up against the
same function on bfloat16 arrays and, for the products, the measured one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from typing import Any

SHAPES = [
    (64, 64, 64),
    (128, 128, 128),
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (1, 768, 3072),
    (8, 768, 3072),
    (32, 768, 3072),
    (128, 768, 3072),
    (512, 768, 3072),
    (256, 3072, 768),
    (256, 768, 768),
    (1, 4096, 4096),
    (16, 4096, 4096),
    (64, 4096, 4096),
    (1024, 4096, 1024),
    (4096, 64, 4096),
    (2048, 512, 128),
    (96, 1536, 384),
    (8192, 256, 256),
    (64, 1024, 4096),
    (512, 2048, 1024),
]
QUICK = [s for s in SHAPES if max(s) <= 1024 and math.prod(s) <= 2**28]
PATHS = {
    "float32": ({}, None, None),
    "int8": ({"contract": "int8"}, "int8", "axis"),
    "int4/bf16": ({"compute": "bfloat16"}, "int4", "block"),
}


def _best(fn: Any, *args: Any) -> float:
    """The fastest of repeated calls: the timer the measured rates use, so the two agree."""
    from precision._roofline import _best_seconds

    return _best_seconds(fn, *args, budget=0.5)


def _converted(tree: Any, fmt: str | None, scaling: str | None) -> Any:
    import dtypes
    import precision

    if fmt is None:
        return tree
    chosen = dtypes.PerAxis(-1) if scaling == "axis" else dtypes.PerBlock(32)
    return precision.to_reduced_precision(
        tree, fmt, scaling=chosen, where=lambda path, leaf: leaf.ndim >= 2 and leaf.size >= 4096
    )


def _row(name: str, f: Any, args: tuple[Any, ...], path: str, fmt_args: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import precision

    options, fmt, scaling = PATHS[path]
    converted = (args[0], _converted(args[1], fmt, scaling), *args[2:])
    report = precision.explain(f, *converted, measure=True, **options)
    measured = _best(jax.jit(precision.apply(f, **options)), *converted)
    row = {
        "row": name,
        "path": path,
        "predicted_s": report.predicted_s,
        "measured_s": measured,
        "ratio": measured / report.predicted_s if report.predicted_s else math.nan,
        "predicted_speedup": report.speedup,
        "compiled": sorted(report.flops_by_type),
    }
    if fmt_args == "product":  # the bfloat16 product, timed as a user would run it
        bf16 = [jnp.asarray(a, jnp.bfloat16) for a in args]
        row["measured_speedup"] = _best(jax.jit(f), *bf16) / measured
    return row


def _products(shapes: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    import jax.numpy as jnp
    import numpy as np

    rows = []
    rng = np.random.default_rng(0)
    for m, k, n in shapes:
        x = jnp.asarray(rng.standard_normal((m, k), np.float32))
        w = jnp.asarray(rng.standard_normal((k, n), np.float32) / math.sqrt(k))
        for path in PATHS:
            if path == "int4/bf16" and k % 32:
                continue
            rows.append(_row(f"{m}x{k}x{n}", lambda x, w: x @ w, (x, w), path, "product"))
            _print(rows[-1])
    return rows


def _models(quick: bool) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from models import _models as build

    rows = []
    for name, (model, shape, kind) in build(quick).items():
        if kind == "tokens":
            data = jnp.zeros(shape, jnp.int32)
        else:
            data = jax.random.normal(jax.random.key(0), shape)
        params = model.init(jax.random.key(1), data)

        def forward(data: Any, params: Any, model: Any = model) -> Any:
            return model.apply(params, data)

        for path in PATHS:
            rows.append(_row(name, forward, (data, params), path, "model"))
            _print(rows[-1])
    return rows


def _print(row: dict[str, Any]) -> None:
    speed = row["predicted_speedup"]
    measured = row.get("measured_speedup")
    print(
        f"{row['row']:>16} {row['path']:>10}  predicted {row['predicted_s'] * 1e3:9.3f} ms"
        f"  measured {row['measured_s'] * 1e3:9.3f} ms  ratio {row['ratio']:5.2f}"
        f"  vs bf16: predicted {speed:5.2f}x"
        + (f" measured {measured:5.2f}x" if measured is not None else "")
        + f"  [{', '.join(row['compiled'])}]",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes and models")
    parser.add_argument("--no-models", action="store_true", help="the products only")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    import jax

    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {platform.processor()}")
    rows = _products(QUICK if args.quick else SHAPES)
    if not args.no_models:
        rows += _models(args.quick)
    within = [r for r in rows if 1 / 1.5 <= r["ratio"] <= 1.5]
    share = len(within) / len(rows)
    print(f"within 1.5x: {len(within)} of {len(rows)} rows ({share:.0%}; target 80%)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
