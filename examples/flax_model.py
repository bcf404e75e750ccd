"""A Flax model converted to reduced precision and run through `precision.apply`.

The model is an ordinary `flax.linen` module; nothing in it knows about
precision. Its parameters are converted with one call per format and
`precision.apply(model.apply)` runs the unchanged forward pass. With a compute
format (bfloat16, float16, tf32) the input is converted too and every
operation is rounded to that format. With a storage encoding (fp8 per tensor,
int8, int4) the weights stay narrow and are decoded where they are used; the
arithmetic is float32, or the compute format declared with `compute=`. The
table compares each run's outputs with the float32 model and reports the
bytes the parameters take.

    python examples/flax_model.py
"""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

import dtypes
import precision


class ConvNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(16, (3, 3))(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(64)(x))
        return nn.Dense(10)(x)


def main() -> None:
    model = ConvNet()
    x = jax.random.uniform(jax.random.key(1), (8, 8, 8, 1))
    variables = model.init(jax.random.key(0), x)
    reference = np.asarray(model.apply(variables, x))
    run = precision.apply(model.apply)

    print(f"{'weights':<16} {'max |error|':>12} {'param bytes':>12}")
    print(f"{'float32':<16} {0.0:>12.2e} {precision.tree_nbytes(variables):>12,}")
    # Compute formats: parameters and input in the format, every op rounded into it.
    for name in ("bfloat16", "float16", "tf32"):
        params = precision.to_reduced_precision(variables, name)
        image = precision.Tensor(x).to_reduced_precision(name)
        out = run(params, image)  # a Tensor in `name`, like its inputs
        assert out.format == dtypes.get(name)
        error = float(np.max(np.abs(np.asarray(out) - reference)))
        print(f"{name:<16} {error:>12.2e} {precision.tree_nbytes(params):>12,}")

    # Storage encodings: weights kept narrow and decoded where they are used;
    # the arithmetic is float32, or the compute format declared at the call.
    for name, scaling, compute in [
        ("float8_e4m3fn", dtypes.PerTensor(), None),
        ("int8", dtypes.PerAxis(-1), None),
        ("int4", dtypes.PerBlock(32), None),
        ("int8", dtypes.PerAxis(-1), "bfloat16"),
    ]:
        params = precision.to_reduced_precision(variables, name, scaling=scaling, exclude="bias")
        out = precision.apply(model.apply, compute=compute)(params, x)
        assert out.format == dtypes.get(compute or "float32")
        error = float(np.max(np.abs(np.asarray(out) - reference)))
        label = name + (f" ({compute})" if compute else "")
        print(f"{label:<16} {error:>12.2e} {precision.tree_nbytes(params):>12,}")

    # Mixing formats is refused: a bfloat16 model meeting a float16 input.
    try:
        run(
            precision.to_reduced_precision(variables, "bf16"),
            precision.Tensor(x).to_reduced_precision("fp16"),
        )
    except precision.PrecisionMismatchError as err:
        print(f"\nrefused as expected: {err}")


if __name__ == "__main__":
    main()
