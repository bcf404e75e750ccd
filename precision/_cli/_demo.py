"""`precision demo`: train the seed's CNN once per precision mode and print one table.

The model is a plain JAX function of (params, images). Each mode only changes
what the parameters and activations are stored and computed in:

- mixed modes convert float32 master weights to reduced Tensors inside the
  loss and run the model through `precision.apply`, so every op rounds its
  output to the compute format; gradients reach the float32 masters
  straight through;
- quantization-aware modes snap the kernels to an integer grid (per output
  channel) in the forward pass, straight-through in the backward pass;
- pure modes store the parameters themselves in bfloat16 and apply each SGD
  update with `precision.apply_updates`, rounding to nearest or
  stochastically.

The images (scikit-learn's digits, or an MNIST-layout `.npz`) come from
`_demo_data`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dtypes

from .. import _applied_operators  # noqa: F401  (Tensor's operators, used by the demo's models)
from .._apply import apply
from .._contract import Contract
from .._loss_scale import DynamicLossScale, NoOpLossScale, all_finite, select_tree
from .._tensor import Tensor, logical_values
from .._tree import to_full_precision, to_reduced_precision, tree_nbytes
from .._updates import apply_updates
from ._demo_data import Dataset, load_data
from ._output import seed_argument

__all__ = [
    "LAYERS",
    "MODES",
    "Dataset",
    "Mode",
    "Params",
    "Row",
    "cnn",
    "cross_entropy",
    "evaluate",
    "format_table",
    "init_params",
    "load_data",
    "main",
    "train",
]

Params = dict[str, dict[str, jax.Array]]


# -- model -------------------------------------------------------------------

LAYERS = ("conv1", "conv2", "dense1", "dense2", "dense3")


def init_params(key: jax.Array, image_shape: tuple[int, int, int]) -> Params:
    """He-normal kernels and zero biases for the seed's CNN."""
    h, w, c = image_shape
    flat = (h // 2) * (w // 2) * 32
    shapes = {
        "conv1": (3, 3, c, 32),
        "conv2": (3, 3, 32, 32),
        "dense1": (flat, 512),
        "dense2": (512, 512),
        "dense3": (512, 10),
    }
    params = {}
    for k, (name, shape) in zip(jax.random.split(key, len(shapes)), shapes.items(), strict=True):
        fan_in = math.prod(shape[:-1])
        gain = 1.0 if name == "dense3" else 2.0
        kernel = jax.random.normal(k, shape, jnp.float32) * np.float32(math.sqrt(gain / fan_in))
        params[name] = {"kernel": kernel, "bias": jnp.zeros(shape[-1], jnp.float32)}
    return params


def cnn(params: Params, images: jax.Array) -> jax.Array:
    """The seed's CNN as a plain JAX function: logits of shape (N, 10).

    conv 3x3x32 + ReLU, conv 3x3x32 + ReLU, 2x2 max-pool, flatten,
    dense 512 + ReLU, dense 512 + ReLU, dense 10.
    """

    def conv(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
        y = lax.conv_general_dilated(
            x, p["kernel"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jax.nn.relu(y + p["bias"].reshape(1, 1, 1, -1))

    def dense(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
        return x @ p["kernel"] + p["bias"].reshape(1, -1)

    x = conv(images, params["conv1"])
    x = conv(x, params["conv2"])
    n, h, w, c = x.shape
    x = x[:, : h // 2 * 2, : w // 2 * 2, :].reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))
    x = x.reshape(n, -1)
    x = jax.nn.relu(dense(x, params["dense1"]))
    x = jax.nn.relu(dense(x, params["dense2"]))
    return dense(x, params["dense3"])


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy, computed in float32."""
    logits = logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


# -- modes -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mode:
    """One way of training the CNN.

    Attributes:
        name: the name used by `--modes` and in the table.
        summary: one line for `--help`.
        compute: format every op of the forward pass rounds to (None: float32).
        weights: integer format the kernels are quantized to (QAT), or None.
        skip_ends: keep the first and last layers in float32 (binary nets).
        loss_scaling: use a dynamic loss scale (for float16).
        storage: format the parameters themselves are stored in, or None for
            float32 master weights.
        rounding: how updates are rounded into `storage`.
        contract: quantization declared at every contraction (a format name
            or a `precision.Contract`): W8A8 and fp8 training, straight-through.
        deploy: integer format a contraction-quantized mode deploys its kernels
            in (W8A8: int8 per output channel, what its dots read), or None.
    """

    name: str
    summary: str
    compute: str | None = None
    weights: str | None = None
    skip_ends: bool = False
    loss_scaling: bool = False
    storage: str | None = None
    rounding: str = "nearest_even"
    contract: Any = None
    deploy: str | None = None


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("fp32", "float32 everywhere"),
        Mode("bf16-mixed", "bfloat16 compute, float32 master weights", compute="bfloat16"),
        Mode(
            "fp16-loss-scale",
            "float16 compute, dynamic loss scale, float32 masters",
            compute="float16",
            loss_scaling=True,
        ),
        Mode("tf32", "tf32 compute (10-bit mantissa), float32 masters", compute="tf32"),
        Mode("int8-qat", "int8 kernels per output channel (STE), float32 masters", weights="int8"),
        Mode("int4-qat", "int4 kernels per output channel (STE), float32 masters", weights="int4"),
        Mode(
            "int1-qat",
            "binary ±mean|w| kernels except first and last layer (STE)",
            weights="int1",
            skip_ends=True,
        ),
        Mode(
            "bf16-pure-nearest",
            "bfloat16 parameters and compute, updates rounded to nearest",
            compute="bfloat16",
            storage="bfloat16",
        ),
        Mode(
            "bf16-pure-stochastic",
            "bfloat16 parameters and compute, updates rounded stochastically",
            compute="bfloat16",
            storage="bfloat16",
            rounding="stochastic",
        ),
        Mode(
            "fp8-hybrid",
            "fp8 contractions: e4m3 forward, e5m2 gradients, per-tensor scales",
            contract=Contract("float8_e4m3fn", backward="float8_e5m2", scaling="tensorwise"),
        ),
        Mode(
            "w8a8-qat",
            "int8 contractions: per-row activations, per-channel kernels, int32 sums",
            contract="int8",
            deploy="int8",
        ),
    )
}


def _kernel_filter(mode: Mode) -> Callable[[tuple[Any, ...], Any], bool]:
    """Selects the kernels a QAT mode quantizes (binary nets keep both ends in float32)."""
    ends = (LAYERS[0], LAYERS[-1]) if mode.skip_ends else ()

    def where(path: tuple[Any, ...], leaf: Any) -> bool:
        keys = [getattr(k, "key", None) for k in path]
        return keys[-1] == "kernel" and keys[0] not in ends

    return where


def _fake_quantize(mode: Mode) -> Callable[[Params], Params]:
    """Kernels snapped to the QAT format's grid, per output channel, straight-through.

    `Format.round` is quantize-dequantize with a straight-through gradient:
    the forward pass sees the integer grid, the float32 master weights get
    the full gradient.
    """
    if mode.weights is None:
        return lambda params: params
    fmt = dtypes.get(mode.weights)
    select = _kernel_filter(mode)

    def quantize(params: Params) -> Params:
        def one(path: tuple[Any, ...], leaf: jax.Array) -> jax.Array:
            if not select(path, leaf):
                return leaf
            return fmt.round(leaf, scaling=dtypes.PerAxis(leaf.ndim - 1))

        quantized: Params = jax.tree_util.tree_map_with_path(one, params)
        return quantized

    return quantize


def _forward(mode: Mode) -> Callable[[Params, jax.Array], jax.Array]:
    """The mode's forward pass: (float32 params, images) -> float32 logits.

    With a compute format F, parameters and images become F Tensors (a
    straight-through conversion, so gradients reach the float32 masters)
    and the plain-JAX `cnn` runs through `precision.apply`, which rounds the
    result of every operation onto F's grid.
    """
    quantize = _fake_quantize(mode)
    if mode.contract is not None:
        # Float32 parameters and images; every conv and dense layer is quantized
        # at the contraction (both operands), the rest stays float32.
        quantized = apply(cnn, compute=mode.compute, contract=mode.contract)
        return lambda params, x: logical_values(quantized(quantize(params), x))
    if mode.compute is None:
        return lambda params, x: cnn(quantize(params), x)
    fmt = dtypes.get(mode.compute)
    model = apply(cnn)

    def forward(params: Params, x: jax.Array) -> jax.Array:
        params = to_reduced_precision(quantize(params), fmt)
        logits = model(params, Tensor(x).to_reduced_precision(fmt))
        return logical_values(logits)  # logical float32 values of the fmt-rounded logits

    return forward


# -- training ----------------------------------------------------------------


class Row(NamedTuple):
    """One line of the table."""

    mode: str
    accuracy: float  # fraction of test images classified correctly
    loss: float  # mean training loss over the last epoch
    first_loss: float  # training loss of the very first step, before any update
    step_ms: float  # wall time per training step, compilation excluded
    param_bytes: int  # bytes of the parameters as this mode keeps/deploys them
    updates_kept: float  # sum |change of stored params| / sum |intended update|


def _stored(mode: Mode, params: Params) -> Any:
    """The parameters as the mode keeps them (QAT, W8A8 included: as it deploys them)."""
    deployed = mode.weights if mode.weights is not None else mode.deploy
    if deployed is not None:
        return to_reduced_precision(
            params, deployed, scaling=dtypes.PerAxis(-1), where=_kernel_filter(mode)
        )
    return params


def _l1(tree: Any) -> jax.Array | int:  # 0 for an empty tree
    leaves = jax.tree_util.tree_leaves(tree)
    return sum(jnp.sum(jnp.abs(x.astype(jnp.float32))) for x in leaves)


def _sgd_step(
    mode: Mode, forward: Callable[[Params, jax.Array], jax.Array], lr: float
) -> Callable[..., tuple[tuple[Any, ...], jax.Array]]:
    """One SGD step of `mode` on the batch `idx` picks: gradients of the float32 view of
    the stored parameters, unscaled, applied in the stored format (not at all when
    they are not finite), with running totals of the changes made and intended.

    The step maps (carry, images, labels, idx) to (carry, loss), the carry being
    (stored parameters, loss scale, rounding key, change made, change intended).
    """

    def loss_fn(p: Any, x: jax.Array, y: jax.Array, ls: Any) -> tuple[jax.Array, jax.Array]:
        loss = cross_entropy(forward(p, x), y)
        return ls.scale(loss), loss

    def step(
        carry: tuple[Any, ...], images: jax.Array, labels: jax.Array, idx: jax.Array
    ) -> tuple[tuple[Any, ...], jax.Array]:
        stored, ls, k, moved, intended = carry
        x, y = images[idx], labels[idx]
        # Differentiate with respect to the float32 view of what is stored.
        grads, loss = jax.grad(loss_fn, has_aux=True)(to_full_precision(stored), x, y, ls)
        grads = ls.unscale(grads)
        finite = all_finite(grads)
        update = jax.tree_util.tree_map(lambda g: -lr * g, grads)
        k, sub = jax.random.split(k)
        key = sub if mode.rounding == "stochastic" else None
        new = apply_updates(stored, update, rounding=mode.rounding, key=key)
        new = select_tree(finite, new, stored)
        change = jax.tree_util.tree_map(
            jnp.subtract, to_full_precision(new), to_full_precision(stored)
        )
        moved = moved + _l1(change)
        intended = intended + jnp.where(finite, _l1(update), 0.0)
        return (new, ls.adjust(finite), k, moved, intended), loss

    return step


def _progress_bar(mode: Mode, total: int, progress: bool) -> Any:
    """The progress bar of one mode's training: `total` steps, on stderr."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=f"{mode.name:>20}",
        unit="step",
        file=sys.stderr,
        disable=None if progress else True,  # None: drawn only when stderr is a terminal
        leave=False,
    )


def train(
    mode: Mode,
    data: Dataset,
    *,
    epochs: int,
    seed: int = 0,
    batch_size: int = 128,
    lr: float = 0.1,
    steps: int | None = None,
    progress: bool = True,
) -> Row:
    """Train the CNN in `mode` and evaluate it on the test split.

    Args:
        mode: one of `MODES`.
        data: the images and labels (`load_data`).
        epochs: passes over the training images (each a fresh permutation).
        seed: seeds the initialization, the batch order and stochastic rounding.
        batch_size: images per SGD step; the last partial batch of an epoch is dropped.
        lr: SGD learning rate.
        steps: at most this many steps per epoch (for quick runs).
        progress: show a progress bar on stderr.

    Returns:
        The mode's row of the table.
    """
    forward = _forward(mode)
    key = jax.random.key(seed)
    init_key, round_key = jax.random.split(key)
    params: Any = init_params(init_key, data.x_train.shape[1:])
    if mode.storage is not None:
        params = to_reduced_precision(params, mode.storage)
    loss_scale: Any = (
        DynamicLossScale(jnp.float32(2.0**15), period=200) if mode.loss_scaling else NoOpLossScale()
    )

    x_train = jnp.asarray(data.x_train)
    y_train = jnp.asarray(data.y_train)
    n = len(data.x_train)
    per_epoch = n // batch_size
    if per_epoch == 0:
        raise ValueError(f"batch size {batch_size} exceeds the {n} training images")
    if steps is not None:
        per_epoch = max(1, min(per_epoch, steps))

    step = _sgd_step(mode, forward, lr)
    carry = (params, loss_scale, round_key, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
    # A Python loop over a jitted step, not lax.scan: XLA:CPU runs convolutions
    # inside a while loop an order of magnitude slower than at top level.
    rng = np.random.default_rng(seed)
    orders = [rng.permutation(n)[: per_epoch * batch_size] for _ in range(epochs)]
    step_fn = (
        jax.jit(step, donate_argnums=0)
        .lower(carry, x_train, y_train, jnp.asarray(orders[0][:batch_size]))
        .compile()
    )

    bar = _progress_bar(mode, epochs * per_epoch, progress)
    elapsed = 0.0
    loss = first_loss = float("nan")
    with bar:
        for e in range(epochs):
            batches = jnp.asarray(orders[e].reshape(per_epoch, batch_size))
            losses = []
            start = time.perf_counter()
            for i in range(per_epoch):
                carry, step_loss = step_fn(carry, x_train, y_train, batches[i])
                losses.append(step_loss)
            loss = float(jnp.mean(jnp.stack(losses)))  # waits for the epoch to finish
            if e == 0:
                first_loss = float(losses[0])
            elapsed += time.perf_counter() - start
            bar.update(per_epoch)
            bar.set_postfix(loss=f"{loss:.4f}")
    stored, _, _, moved, intended = carry
    params = to_full_precision(stored)
    accuracy = evaluate(forward, params, data)
    return Row(
        mode=mode.name,
        accuracy=accuracy,
        loss=loss,
        first_loss=first_loss,
        step_ms=1000 * elapsed / (epochs * per_epoch),
        param_bytes=tree_nbytes(_stored(mode, stored)),
        updates_kept=float(moved / intended) if float(intended) > 0 else float("nan"),
    )


def evaluate(
    forward: Callable[[Params, jax.Array], jax.Array],
    params: Params,
    data: Dataset,
    chunk: int = 1000,
) -> float:
    """Fraction of test images whose argmax logit is the label."""
    predict = jax.jit(lambda p, x: jnp.argmax(forward(p, x), axis=-1))
    correct = 0
    for i in range(0, len(data.x_test), chunk):
        pred = predict(params, jnp.asarray(data.x_test[i : i + chunk]))
        correct += int(jnp.sum(pred == jnp.asarray(data.y_test[i : i + chunk])))
    return correct / len(data.x_test)


# -- table and command line -------------------------------------------------


def format_table(rows: Sequence[Row]) -> str:
    """The results as an aligned text table with footnotes."""
    header = ("mode", "test acc", "final loss", "ms/step", "param bytes", "updates kept")
    lines = [
        (
            r.mode,
            f"{100 * r.accuracy:.2f}%",
            f"{r.loss:.4f}",
            f"{r.step_ms:.2f}",
            f"{r.param_bytes:,}",
            f"{100 * r.updates_kept:.1f}%",
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join((first, *rest))

    out = [fmt(header), "  ".join("-" * w for w in widths), *(fmt(line) for line in lines)]
    out.append("")
    out.append(
        "param bytes: the parameters as each mode keeps them; QAT rows count the deployed "
        "model (packed integer kernels, one float32 scale per output channel)."
    )
    out.append(
        "updates kept: sum |change of the stored parameters| / sum |SGD update| over training. "
        "Rounded to nearest, a bfloat16 parameter ignores every update below half its spacing "
        "(2^-9 to 2^-8 of its magnitude); stochastic rounding keeps them on average."
    )
    return "\n".join(out)


def _write_json(path: str, rows: Sequence[Row]) -> None:
    payload = [r._asdict() for r in rows]  # the keys in Row's order, as documented
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".demo-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _parser() -> argparse.ArgumentParser:
    width = max(len(name) for name in MODES)
    modes = "\n".join(f"  {m.name:<{width}}  {m.summary}" for m in MODES.values())
    p = argparse.ArgumentParser(
        prog="precision demo",
        description="Train the seed's CNN once per precision mode and print one table.",
        epilog=f"modes:\n{modes}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--modes",
        default="all",
        help=f"comma-separated modes, or 'all' (default): {', '.join(MODES)}",
    )
    p.add_argument("--epochs", type=int, default=30, help="epochs per mode (default 30)")
    p.add_argument("--seed", type=seed_argument, default=0, help="seed of init, batches, rounding")
    p.add_argument("--data", metavar="PATH.npz", help="MNIST-layout .npz instead of digits")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    p.add_argument("--steps", type=int, help="at most this many steps per epoch (quick runs)")
    p.add_argument("--batch-size", type=int, default=128, help="batch size (default 128)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars or lines")
    return p


def _checked_modes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The modes `--modes` names, once every argument is checked (`parser.error` exits)."""
    if args.modes == "all":
        modes = list(MODES)
    else:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in modes if m not in MODES]
        if unknown or not modes:
            parser.error(
                f"unknown mode(s) {', '.join(unknown) or '(none given)'}; "
                f"choose from {', '.join(MODES)}"
            )
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    if not (args.lr > 0):
        parser.error("--lr must be positive")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        # Checked before training, so a long run is not lost at the end.
        parser.error(f"--json {args.json}: its directory does not exist")
    if args.json and os.path.lexists(args.json) and not os.path.isfile(args.json):
        parser.error(f"--json {args.json}: it exists and is not a regular file; name a file")
    return modes


def main(argv: list[str] | None = None) -> int:
    """Entry point of `precision demo`; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    modes = _checked_modes(parser, args)
    try:
        dataset = load_data(args.data)
    except (OSError, ValueError) as e:
        print(f"precision demo: {e}", file=sys.stderr)
        return 2
    print(
        f"{dataset.name}: {len(dataset.x_train)} train / {len(dataset.x_test)} test images; "
        f"{args.epochs} epochs, batch {args.batch_size}, SGD lr {args.lr}, seed {args.seed}; "
        f"{jax.devices()[0].platform}",
        file=sys.stderr,
    )
    # Progress: tqdm's bars on a terminal; elsewhere (a log, a pipe) a plain line per mode.
    lines = not args.no_progress and not sys.stderr.isatty()
    rows: list[Row] = []
    options = {k: getattr(args, k) for k in ("epochs", "seed", "batch_size", "lr", "steps")}
    for i, name in enumerate(modes, 1):
        if lines:
            print(f"[{i}/{len(modes)}] {name}: compiling, then training", file=sys.stderr)
        start = time.perf_counter()
        rows.append(train(MODES[name], dataset, **options, progress=not args.no_progress))
        if lines:
            r, took = rows[-1], time.perf_counter() - start
            print(
                f"[{i}/{len(modes)}] {name}: {100 * r.accuracy:.2f}% test accuracy, "
                f"loss {r.loss:.4f}, {took:.0f} s",
                file=sys.stderr,
            )
    print(format_table(rows))
    if args.json:
        _write_json(args.json, rows)
    return 0
