"""What each contraction with a parameter sees: the statistics calibration needs.

`record(f, leaves, rebuild)` returns a function of `(leaves, batch)` that runs
`f(params, batch)` equation by equation, as JAX's own evaluator would, while
following each parameter leaf through the layout-only operations
(`transpose`, dtype conversions, calls). At every `dot_general` where one
operand is a parameter contracted over one of its axes and the other is not a
parameter, it adds up, for that site, the input statistics of the activation
operand `x` flattened to rows of its contracted length `K` (for a convolution
whose kernel is a parameter: the input patches, `K` = window x channels):

- `h`: the `K x K` sum of `x_r x_r^T` over rows (GPTQ's Hessian, up to 2/n),
- `absmax`, `abssum`: per input channel (AWQ, SmoothQuant),
- `rows` and `bad`, the number of rows and of non-finite values seen.

Layers under `scan` are recorded per iteration: a weight scanned as `xs`
(stacked layers) gets statistics with the stacked length in front; a weight
that every iteration reads (a loop constant) gets their sum.

Alongside, found while tracing (`Found`): which sites read the same folded
normalization output (`_affine`), whether folding a scale into it is safe,
and how many contractions read each weight.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from ._affine import SAME_VALUES, Tag, carry_axes, propagate

__all__ = ["FoldKey", "Found", "Origin", "SiteKey", "Stats", "record"]

# (leaf index, contracted leaf axes in the order of the recorded inputs' K features,
#  leaf axes indexed by enclosing scans): (axis,) for a matrix; for a convolution
#  kernel its spatial axes then its input-channel axis (channels fastest)
SiteKey = tuple[int, tuple[int, ...], tuple[int, ...]]


# (leaf of a normalization's per-feature scale, leaf of its shift or None)
FoldKey = tuple[int, int | None]


@dataclasses.dataclass
class Found:
    """What tracing found: the sites reading each foldable normalization output, the
    outputs that reach something else too (unsafe to fold), the contractions per leaf."""

    folds: dict[FoldKey, set[SiteKey]] = dataclasses.field(default_factory=dict)
    unsafe: set[FoldKey] = dataclasses.field(default_factory=set)
    uses: Counter[int] = dataclasses.field(default_factory=Counter)
    ndims: list[int] = dataclasses.field(default_factory=list)
    order: list[int] = dataclasses.field(default_factory=list)  # leaves, first use first
    wanted: frozenset[int] | None = None  # record these leaves' statistics only

    def reset(self, ndims: list[int]) -> None:
        """Forget an earlier trace (a new batch shape traces again); keep `wanted`."""
        self.folds.clear()
        self.unsafe.clear()
        self.uses.clear()
        self.order.clear()
        self.ndims = ndims

    def met(self, leaf: int) -> bool:
        """Note a contraction reading `leaf`; whether to record its statistics."""
        if leaf not in self.uses:
            self.order.append(leaf)
        self.uses[leaf] += 1
        return self.wanted is None or leaf in self.wanted

    def refuse(self, tags: list[Tag | None]) -> None:
        for t in tags:
            if t is not None:
                self.unsafe.add((t.scale, t.bias))


class Stats(NamedTuple):
    """Input statistics of one site (arrays; a leading axis per stacking scan)."""

    h: Any
    absmax: Any
    abssum: Any
    rows: Any
    bad: Any


class Origin(NamedTuple):
    """Where a value comes from: parameter `leaf`, the leaf axis of each of its axes,
    and the scans that index the leaf (`(scan id, leaf axis)`, outermost first)."""

    leaf: int
    axes: tuple[int | None, ...]
    stacked: tuple[tuple[int, int], ...]


_scan_ids = itertools.count()


def _conv_rows(eqn: Any, x: jax.Array, spatial: tuple[int, ...]) -> jax.Array:
    """The input patches a convolution multiplies by its kernel, as rows of
    (spatial..., channels) features: the kernel's contracted axes in that order."""
    p = eqn.params
    dn = p["dimension_numbers"]
    canonical = jnp.transpose(x, dn.lhs_spec)  # (batch, channels, spatial...)
    patches = lax.conv_general_dilated_patches(
        canonical,
        spatial,
        p["window_strides"],
        p["padding"],
        lhs_dilation=p["lhs_dilation"],
        rhs_dilation=p["rhs_dilation"],
        precision=lax.Precision.HIGHEST,
    )  # (batch, channels * prod(spatial), out spatial...): channel-major features
    c = canonical.shape[1]
    rows = jnp.moveaxis(patches, 1, -1).reshape(-1, c, int(np.prod(spatial)))
    return jnp.swapaxes(rows, 1, 2).reshape(rows.shape[0], -1)


def _site_stats(x: jax.Array, axis: int) -> Stats:
    k = x.shape[axis]
    return _row_stats(jnp.moveaxis(x, axis, -1).reshape(-1, k))


def _row_stats(rows: jax.Array) -> Stats:
    rows = rows.astype(jnp.float32)
    finite = jnp.isfinite(rows)
    clean = jnp.where(finite, rows, 0.0)
    h = jnp.einsum("ri,rj->ij", clean, clean, precision=lax.Precision.HIGHEST)
    return Stats(
        h,
        jnp.max(jnp.abs(clean), axis=0),
        jnp.sum(jnp.abs(clean), axis=0),
        jnp.float32(rows.shape[0]),
        jnp.sum(~finite, dtype=jnp.int32),
    )


def _add(stats: dict[Any, Stats], key: Any, new: Stats) -> None:
    old = stats.get(key)
    if old is None:
        stats[key] = new
    else:
        stats[key] = Stats(
            old.h + new.h,
            jnp.maximum(old.absmax, new.absmax),
            old.abssum + new.abssum,
            old.rows + new.rows,
            old.bad + new.bad,
        )


def _dot(
    eqn: Any,
    origins: list[Origin | None],
    tags: list[Tag | None],
    vals: list[Any],
    stats: dict[Any, Stats],
    found: Found,
) -> None:
    """Record the activation statistics of one `dot_general`, if one side is a weight."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    folded = [False, False]
    for w, x, cw, cx, bw in ((0, 1, lc, rc, lb), (1, 0, rc, lc, rb)):
        o = origins[w]
        if o is None or origins[x] is not None or len(cw) != 1 or bw:
            continue
        axis = o.axes[cw[0]]
        if axis is None:
            continue
        key = (o.leaf, (axis,), o.stacked)
        if found.met(o.leaf):
            _add(stats, key, _site_stats(vals[x], cx[0]))
        t = tags[x]
        if t is not None and t.axis == cx[0] and not o.stacked:
            site = (o.leaf, (axis,), ())
            found.folds.setdefault((t.scale, t.bias), set()).add(site)
            folded[x] = True
    found.refuse([t for t, ok in zip(tags, folded, strict=True) if not ok])


def _conv(
    eqn: Any,
    origins: list[Origin | None],
    vals: list[Any],
    stats: dict[Any, Stats],
    found: Found,
) -> None:
    """Record the input patches of a convolution whose kernel is a weight."""
    p = eqn.params
    o = origins[1]
    if o is None or origins[0] is not None:
        return
    if p["feature_group_count"] != 1 or p["batch_group_count"] != 1:
        return  # grouped / depthwise kernels: not one matrix
    rhs = p["dimension_numbers"].rhs_spec  # (out, in, spatial...) axes of the kernel
    axes = tuple(o.axes[a] for a in (*rhs[2:], rhs[1]))
    if any(a is None for a in axes):
        return
    spatial = tuple(int(eqn.invars[1].aval.shape[a]) for a in rhs[2:])
    if found.met(o.leaf):
        key = (o.leaf, axes, o.stacked)
        _add(stats, key, _row_stats(_conv_rows(eqn, vals[0], spatial)))


def _walk(
    jaxpr: Any,
    consts: list[Any],
    invals: list[Any],
    origins: list[Origin | None],
    tags: list[Tag | None],
    stats: dict[Any, Stats],
    found: Found,
) -> tuple[list[Any], list[Origin | None], list[Tag | None]]:
    env: dict[Any, tuple[Any, Origin | None, Tag | None]] = {}

    def read(v: Any) -> tuple[Any, Origin | None, Tag | None]:
        return (v.val, None, None) if isinstance(v, compat.Literal) else env[v]

    for var, c in zip(jaxpr.constvars, consts, strict=True):
        env[var] = (c, None, None)
    for var, v, o, t in zip(jaxpr.invars, invals, origins, tags, strict=True):
        env[var] = (v, o, t)
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        vals, orgs, tgs = [v for v, _, _ in ins], [o for _, o, _ in ins], [t for _, _, t in ins]
        name = eqn.primitive.name
        n_out = len(eqn.outvars)
        out_orgs: list[Origin | None] = [None] * n_out
        out_tags: list[Tag | None] = [None] * n_out
        if eqn.primitive in compat.CALLS or eqn.primitive is compat.REMAT:
            inner, inner_consts = compat.closed(compat.inner_jaxpr(eqn))
            outs, out_orgs, out_tags = _walk(inner, inner_consts, vals, orgs, tgs, stats, found)
        elif eqn.primitive is compat.SCAN:
            found.refuse(tgs)
            outs = _scan(eqn, vals, orgs, stats, found)
        else:
            if name == "dot_general":
                _dot(eqn, orgs, tgs, vals, stats, found)
            elif name == "conv_general_dilated":
                found.refuse(tgs)
                _conv(eqn, orgs, vals, stats, found)
            else:
                out_tags, ok = propagate(eqn, orgs, tgs, found.ndims)
                if not ok:
                    found.refuse(tgs)
                o = orgs[0] if orgs else None  # (iota and constants have no inputs)
                if o is not None and name in SAME_VALUES:
                    out_orgs = [o]
                elif o is not None and name == "transpose":
                    perm = eqn.params["permutation"]
                    out_orgs = [o._replace(axes=tuple(o.axes[p] for p in perm))]
                elif o is not None and name in ("broadcast_in_dim", "reshape", "squeeze"):
                    axes = carry_axes(eqn, o.axes)
                    out_orgs = [None if axes is None else o._replace(axes=axes)]
            outs = compat.bind_eqn(eqn, *vals)
        for var, out, o, t in zip(eqn.outvars, outs, out_orgs, out_tags, strict=True):
            env[var] = (out, o, t)
    results = [read(v) for v in jaxpr.outvars]
    return [v for v, _, _ in results], [o for _, o, _ in results], [t for _, _, t in results]


def _scan(
    eqn: Any, vals: list[Any], orgs: list[Origin | None], stats: dict[Any, Stats], found: Found
) -> list[Any]:
    p = eqn.params
    nc, nk = compat.scan_counts(p)
    me = next(_scan_ids)
    x_orgs: list[Origin | None] = []
    for o in orgs[nc + nk :]:
        if o is None or o.axes[0] is None:
            x_orgs.append(None)
        else:
            x_orgs.append(Origin(o.leaf, o.axes[1:], (*o.stacked, (me, o.axes[0]))))
    inner, inner_consts = compat.closed(p["jaxpr"])
    const_vals, const_orgs = vals[:nc], orgs[:nc]
    n_in = len(vals)

    def body(carry: list[Any], xs: list[Any]) -> tuple[list[Any], tuple[list[Any], Any]]:
        local: dict[Any, Stats] = {}
        outs, _, _ = _walk(
            inner,
            inner_consts,
            [*const_vals, *carry, *xs],
            [*const_orgs, *([None] * nk), *x_orgs],
            [None] * n_in,
            local,
            found,
        )
        return outs[:nk], (outs[nk:], local)

    final, (ys, per_step) = lax.scan(
        body,
        vals[nc : nc + nk],
        vals[nc + nk :],
        length=p["length"],
        reverse=p["reverse"],
        unroll=p["unroll"],
    )
    for key, s in per_step.items():
        stacked = key[2]
        if stacked and stacked[-1][0] == me:
            _add(stats, key, s)  # one layer per iteration: kept stacked
        else:  # read by every iteration: summed
            _add(
                stats,
                key,
                Stats(
                    jnp.sum(s.h, 0),
                    jnp.max(s.absmax, 0),
                    jnp.sum(s.abssum, 0),
                    jnp.sum(s.rows, 0),
                    jnp.sum(s.bad, 0),
                ),
            )
    return [*final, *ys]


def record(
    f: Callable[..., Any], rebuild: Callable[[list[Any]], Any], found: Found
) -> Callable[[list[Any], Any], dict[SiteKey, Stats]]:
    """A function `(leaves, batch) -> {site: Stats}` recording `f(rebuild(leaves), batch)`;
    tracing it fills `found`."""

    def run(leaves: list[Any], batch: Any) -> dict[SiteKey, Stats]:
        flat_batch, batch_tree = jax.tree_util.tree_flatten(batch)
        n = len(leaves)

        def flat_f(*xs: Any) -> Any:
            return f(rebuild(list(xs[:n])), jax.tree_util.tree_unflatten(batch_tree, xs[n:]))

        closed = jax.make_jaxpr(flat_f)(*leaves, *flat_batch)
        found.reset([jnp.ndim(leaf) for leaf in leaves])
        origins: list[Origin | None] = [
            Origin(i, tuple(range(jnp.ndim(leaf))), ()) for i, leaf in enumerate(leaves)
        ]
        stats: dict[Any, Stats] = {}
        _, _, out_tags = _walk(
            closed.jaxpr,
            list(closed.consts),
            [*leaves, *flat_batch],
            [*origins, *([None] * len(flat_batch))],
            [None] * (n + len(flat_batch)),
            stats,
            found,
        )
        found.refuse(out_tags)  # a normalization's output returned by f
        return {
            (leaf, axes, tuple(a for _, a in stacked)): s
            for (leaf, axes, stacked), s in stats.items()
        }

    return run
