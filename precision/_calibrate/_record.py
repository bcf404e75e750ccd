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

A weight contracted over several axes (Flax's `DenseGeneral`, the output
projection of its attention) is recorded with `K` = the product of their
lengths. A grouped or depthwise convolution (`feature_group_count` G) gets
statistics per group, with G in front: each group's outputs read only their
own input channels.

Layers under `scan` are recorded per iteration: a weight scanned as `xs`
(stacked layers) gets statistics with the stacked length in front; a weight
that every iteration reads (a loop constant) gets their sum. Inside `cond`
every branch runs and only the taken branch's statistics and outputs count;
inside `while` the statistics are carried through the loop and summed over the
iterations that ran.

A contraction that reads a weight in a way none of this covers (batched by the
contraction, both operands weights, a contracted axis made by a reshape) is
noted in `Found.skipped` with the reason, so that `calibrate` can say so.

Alongside, found while tracing (`Found`): which sites read the same folded
normalization output (`_affine`), whether folding a scale into it is safe,
and how many contractions read each weight.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_compat as compat
from .._walk import Interpretation, Scan, ShardMap, While, Wrapper, walk, walk_closed
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
    skipped: dict[int, str] = dataclasses.field(default_factory=dict)  # leaf: why not
    reads: dict[int, int] = dataclasses.field(default_factory=dict)  # leaf: its input's id

    def reset(self, ndims: list[int]) -> None:
        """Forget an earlier trace (a new batch shape traces again); keep `wanted`."""
        self.folds.clear()
        self.unsafe.clear()
        self.uses.clear()
        self.order.clear()
        self.skipped.clear()
        self.reads.clear()
        self.ndims = ndims

    def skip(self, leaf: int, why: str) -> None:
        """Note a contraction reading `leaf` that is not recorded, and why."""
        self.skipped.setdefault(leaf, why)

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
    via: str | None = None  # a slice or reshape the walk does not follow (axes all None)


# equations that pick part of a weight or mix its axes: the result is still that
# weight's values, but not axis for axis (`w[i]` of a stack, `w.reshape(-1, n)`).
# Not `gather`: a lookup by token (an embedding) makes an activation.
_RESHAPED = frozenset({"dynamic_slice", "slice", "reshape"})


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


def _site_stats(x: jax.Array, axes: tuple[int, ...]) -> Stats:
    """Statistics of `x`'s rows over its contracted `axes` (the last fastest)."""
    k = int(np.prod([x.shape[a] for a in axes]))
    tail = tuple(range(x.ndim - len(axes), x.ndim))
    return _row_stats(jnp.moveaxis(x, axes, tail).reshape(-1, k))


def _group_stats(rows: jax.Array, positions: int, groups: int) -> Stats:
    """Per-group statistics (G in front) of a grouped convolution's patches, whose
    features are (window positions, channels) with channels fastest."""
    n, features = rows.shape
    per = rows.reshape(n, positions, groups, features // (positions * groups))
    per = jnp.moveaxis(per, 2, 0).reshape(groups, n, -1)
    return jax.vmap(_row_stats)(per)


def _masked(s: Stats, keep: Any) -> Stats:
    """`s` where `keep` holds, zero statistics elsewhere (a branch not taken)."""
    return Stats(*(jnp.where(keep, v, jnp.zeros_like(v)) for v in s))


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


def _unfollowed(o: Origin) -> str:
    """Why a weight's contracted axes are not its own axes."""
    if o.via is not None:
        return f"it reaches its contraction through `{o.via}` (a part or a reshape of it)"
    return "an axis it is contracted over is broadcast, not one of its own"


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
        if o is None or not cw:
            continue
        axes = tuple(o.axes[c] for c in cw)
        other = origins[x]
        why = (
            "both operands of its contraction are parameters"
            if other is not None and other.via is None
            else "its contraction batches over one of its axes"
            if bw
            else _unfollowed(o)
            if any(a is None for a in axes)
            else None
        )
        if why is not None:
            found.skip(o.leaf, why)
            continue
        # features in the weight's own axis order (its last contracted axis fastest),
        # whichever order the contraction lists them in
        pairs = sorted(zip(axes, cx, strict=True))
        axes = tuple(a for a, _ in pairs)
        key = (o.leaf, axes, o.stacked)
        found.reads.setdefault(o.leaf, id(eqn.invars[x]))
        if found.met(o.leaf):
            _add(stats, key, _site_stats(vals[x], tuple(c for _, c in pairs)))
        t = tags[x]
        if len(cw) == 1 and t is not None and t.axis == cx[0] and not o.stacked:
            site = (o.leaf, axes, ())
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
    """Record the input patches of a convolution whose kernel is a weight (per group,
    for a grouped or depthwise one)."""
    p = eqn.params
    o = origins[1]
    if o is None:
        return
    rhs = p["dimension_numbers"].rhs_spec  # (out, in, spatial...) axes of the kernel
    axes = tuple(o.axes[a] for a in (*rhs[2:], rhs[1]))
    why = (
        "its input is a parameter too"
        if origins[0] is not None and origins[0].via is None
        else "its convolution groups the batch (batch_group_count)"
        if p["batch_group_count"] != 1
        else _unfollowed(o)
        if any(a is None for a in axes)
        else None
    )
    if why is not None:
        found.skip(o.leaf, why)
        return
    spatial = tuple(int(eqn.invars[1].aval.shape[a]) for a in rhs[2:])
    found.reads.setdefault(o.leaf, id(eqn.invars[0]))
    if found.met(o.leaf):
        key = (o.leaf, axes, o.stacked)
        rows = _conv_rows(eqn, vals[0], spatial)
        groups = int(p["feature_group_count"])
        new = _row_stats(rows) if groups == 1 else _group_stats(rows, int(np.prod(spatial)), groups)
        _add(stats, key, new)


# A value as the recorder walks it: (value, the parameter it is, the affine tag).
_Rec = tuple[Any, Origin | None, Tag | None]


class _Recorder(Interpretation[_Rec]):
    """The walk's values are `(value, Origin | None, Tag | None)`; contractions with a
    weight on one side add their activation statistics to `stats`."""

    def __init__(self, stats: dict[Any, Stats], found: Found) -> None:
        self.stats = stats
        self.found = found

    def literal(self, value: Any) -> _Rec:
        return (value, None, None)

    def constant(self, value: Any) -> _Rec:
        return (value, None, None)

    def equation(self, eqn: Any, ins: list[_Rec]) -> list[_Rec]:
        return _equation(eqn, ins, self.stats, self.found)

    def wrapped(self, eqn: Any, kind: Wrapper, body: Any, ins: list[_Rec]) -> list[_Rec]:
        # the function is the body: recorded as it runs (derivatives play no part)
        return walk_closed(body, ins, self)

    def cond(self, eqn: Any, index: _Rec, branches: list[Any], ops: list[_Rec]) -> list[_Rec]:
        self.found.refuse([t for _, _, t in [index, *ops]])
        vals = [index[0], *(v for v, _, _ in ops)]
        orgs = [index[1], *(o for _, o, _ in ops)]
        outs = _cond(branches, vals, orgs, self.stats, self.found)
        return [(v, None, None) for v in outs]

    def scan(self, eqn: Any, parts: Scan, ins: list[_Rec]) -> list[_Rec]:
        self.found.refuse([t for _, _, t in ins])
        vals, orgs = [v for v, _, _ in ins], [o for _, o, _ in ins]
        return [(v, None, None) for v in _scan(eqn, parts, vals, orgs, self.stats, self.found)]

    def while_loop(self, eqn: Any, parts: While, ins: list[_Rec]) -> list[_Rec]:
        self.found.refuse([t for _, _, t in ins])
        vals, orgs = [v for v, _, _ in ins], [o for _, o, _ in ins]
        return [(v, None, None) for v in _while(parts, vals, orgs, self.stats, self.found)]

    def shard_map(self, eqn: Any, parts: ShardMap, ins: list[_Rec]) -> list[_Rec]:
        # per-shard statistics would need summing across the mesh: not recorded, said
        for _, o, _ in ins:
            if o is not None:
                self.found.skip(
                    o.leaf, "it is used inside shard_map, which calibration does not enter"
                )
        self.found.refuse([t for _, _, t in ins])
        return [(v, None, None) for v in compat.bind_eqn(eqn, *(v for v, _, _ in ins))]


def _equation(eqn: Any, ins: list[_Rec], stats: dict[Any, Stats], found: Found) -> list[_Rec]:
    """One first-order equation: statistics at a contraction with a weight, origins
    followed through layout-only moves, affine tags propagated."""
    vals, orgs, tgs = [v for v, _, _ in ins], [o for _, o, _ in ins], [t for _, _, t in ins]
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    out_orgs: list[Origin | None] = [None] * n_out
    out_tags: list[Tag | None] = [None] * n_out
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
        if o is not None and out_orgs == [None] and name in _RESHAPED:
            ndim = len(eqn.outvars[0].aval.shape)
            out_orgs = [o._replace(axes=(None,) * ndim, via=o.via or name)]
    outs = compat.bind_eqn(eqn, *vals)
    return list(zip(outs, out_orgs, out_tags, strict=True))


def _walk(
    jaxpr: Any,
    consts: list[Any],
    invals: list[Any],
    origins: list[Origin | None],
    tags: list[Tag | None],
    stats: dict[Any, Stats],
    found: Found,
) -> tuple[list[Any], list[Origin | None], list[Tag | None]]:
    """`walk` of `jaxpr` under the recorder: (values, origins, tags) of its outputs."""
    ins = list(zip(invals, origins, tags, strict=True))
    results = walk(jaxpr, consts, ins, _Recorder(stats, found))
    return [v for v, _, _ in results], [o for _, o, _ in results], [t for _, _, t in results]


def _scan(
    eqn: Any,
    parts: Scan,
    vals: list[Any],
    orgs: list[Origin | None],
    stats: dict[Any, Stats],
    found: Found,
) -> list[Any]:
    nc, nk = parts.n_consts, parts.n_carry
    me = id(eqn)  # the same in every walk of this jaxpr (`_while` walks a body twice)
    x_orgs: list[Origin | None] = []
    for o in orgs[nc + nk :]:
        if o is None or o.axes[0] is None:
            x_orgs.append(None)
        else:
            x_orgs.append(Origin(o.leaf, o.axes[1:], (*o.stacked, (me, o.axes[0]))))
    inner, inner_consts = compat.closed(parts.body)
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
        length=parts.length,
        reverse=parts.reverse,
        unroll=parts.unroll,
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


def _cond(
    branches: list[Any],
    vals: list[Any],
    orgs: list[Origin | None],
    stats: dict[Any, Stats],
    found: Found,
) -> list[Any]:
    """Run every branch on the operands; keep the taken branch's outputs and statistics."""
    index, ops, op_orgs = vals[0], vals[1:], orgs[1:]
    results = []
    for b, branch in enumerate(branches):
        inner, inner_consts = compat.closed(branch)
        local: dict[Any, Stats] = {}
        outs, _, _ = _walk(inner, inner_consts, ops, op_orgs, [None] * len(ops), local, found)
        for key, s in local.items():
            _add(stats, key, _masked(s, index == b))
        results.append(outs)
    return [lax.select_n(index, *cases) for cases in zip(*results, strict=True)]


def _while(
    parts: While, vals: list[Any], orgs: list[Origin | None], stats: dict[Any, Stats], found: Found
) -> list[Any]:
    """Run the loop with each iteration's statistics added to a carried total."""
    nc, nb = parts.n_cond_consts, parts.n_body_consts
    cond_consts, body_consts, init = vals[:nc], vals[nc : nc + nb], vals[nc + nb :]
    body_orgs = [*orgs[nc : nc + nb], *([None] * len(init))]
    body, body_inner = compat.closed(parts.body)
    test, test_inner = compat.closed(parts.cond)
    n_in = nb + len(init)

    def one(carry: list[Any], seen: Found) -> tuple[list[Any], dict[Any, Stats]]:
        local: dict[Any, Stats] = {}
        outs, _, _ = _walk(
            body, body_inner, [*body_consts, *carry], body_orgs, [None] * n_in, local, seen
        )
        return outs, local

    # what one iteration records (traced on a copy, so uses are counted once)
    _, shapes = jax.eval_shape(lambda c: one(c, copy.deepcopy(found)), list(init))
    zero = {k: Stats(*(jnp.zeros(v.shape, v.dtype) for v in s)) for k, s in shapes.items()}

    def keep_going(state: tuple[list[Any], Any]) -> Any:
        carry = state[0]
        n = len(cond_consts) + len(carry)
        outs, _, _ = _walk(
            test, test_inner, [*cond_consts, *carry], [None] * n, [None] * n, {}, found
        )
        return outs[0]

    def step(state: tuple[list[Any], Any]) -> tuple[list[Any], Any]:
        outs, local = one(state[0], found)
        total = dict(state[1])
        for key, s in local.items():
            _add(total, key, s)
        return outs, total

    final, totals = lax.while_loop(keep_going, step, (list(init), zero))
    for key, s in totals.items():
        _add(stats, key, s)
    return list(final)


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
