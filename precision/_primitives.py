"""The one table of primitives: what each JAX primitive does to a value's format.

`precision.apply`'s walk (`_walk.py`) and its rules (`_compute/`) read a
primitive's kind here and nowhere else; a primitive the table does not hold is
named in a `PrecisionFallbackWarning` the first time a walk meets it, and then
computed as the `compute` kind is (docs/design.md §5). The table lists every
primitive that `jax.numpy`, `jax.lax`, `jax.nn` and `jax.scipy` define in JAX
0.10 to 0.12 (`tests/precision/test_primitives.py` enumerates them on the JAX
installed and fails on one it does not hold).

The kinds:

- `identity`: the output is the input itself (`copy`, `stop_gradient`): a storage
  value passes through with its codes.
- `cut`: a part of the input (`slice`, `dynamic_slice`, `squeeze`): storage codes,
  scales and zero points are cut alike where no scaling group is split.
- `code move`: the input's elements moved or negated (`reshape`, `transpose`,
  `neg`, `abs`, ...): an unpacked one-scale encoding moves its codes.
- `move`: outputs are input elements moved, selected or negated (`gather`,
  `concatenate`, `select_n`, `max`, `sort`, ...): a value on a compute format's
  grid stays on it, so nothing is rounded; storage is decoded.
- `grid`: maps a value on a binary float grid to one on the same grid (`floor`,
  `round`, `sign`): not rounded again under an unscaled float format.
- `contraction`: `dot_general` and `conv_general_dilated` (`_compute/_contractions`).
- `compute`: computes new floating values: each floating output is rounded onto
  the op's compute format. A few only move values (`scatter`, `split`, `top_k`):
  rounding leaves values already on the grid as they are.
- `no float`: no floating output (comparisons, integer and bit operations, random
  keys, tokens, callbacks' effects): nothing to round.
- `walked`: holds a jaxpr that the walk evaluates equation by equation (calls,
  `cond`, `scan`, `while`, `remat`, `custom_jvp`, `custom_vjp`, `shard_map`).
- `opaque`: holds a jaxpr the walk does not enter (`custom_linear_solve`, a
  callback, a foreign call): evaluated as one operation on its inputs' values,
  its floating outputs rounded onto the compute format, like `compute`.
"""

from __future__ import annotations

import typing
from types import MappingProxyType
from typing import Literal

__all__ = [
    "CODE_MOVES",
    "CUTS",
    "GRID",
    "IDENTITIES",
    "KINDS",
    "MOVES",
    "PRIMITIVES",
    "Kind",
    "kind_of",
]

Kind = Literal[
    "identity",
    "cut",
    "code move",
    "move",
    "grid",
    "contraction",
    "compute",
    "no float",
    "walked",
    "opaque",
]
KINDS: tuple[Kind, ...] = typing.get_args(Kind)

_GROUPS: dict[Kind, str] = {
    "identity": "copy stop_gradient sharding_constraint",
    "cut": "slice dynamic_slice squeeze",
    "code move": "reshape transpose broadcast_in_dim rev neg abs",
    "move": """
        gather concatenate dynamic_update_slice select_n pad max min clamp
        reduce_max reduce_min cummax cummin sort device_put optimization_barrier
        """,
    "grid": "sign floor ceil round reduce_precision",
    "contraction": "dot_general conv_general_dilated",
    "compute": """
        add sub mul div rem pow integer_pow exp exp2 expm1 log log1p log2 sqrt rsqrt
        cbrt square tanh logistic sin cos tan asin acos atan sinh cosh asinh acosh
        atanh atan2 erf erfc erf_inv lgamma digamma polygamma igamma igammac
        igamma_grad_a zeta bessel_i0e bessel_i1e regularized_incomplete_beta
        random_gamma nextafter one_minus_square polynomial add_any convert_element_type
        bitcast_convert_type real imag conj complex reduce_sum reduce_prod reduce
        reduce_window reduce_window_sum reduce_window_max reduce_window_min cumsum
        cumprod cumlogsumexp select_and_gather_add select_and_scatter_add
        select_and_scatter scatter scatter-add scatter-sub scatter-mul scatter-min
        scatter-max top_k approx_top_k split tile broadcast_to stack unstack
        zeros_like empty empty2 ragged_dot_general scaled_dot scaled_matmul
        scaled_matmul_wrapper dot_product_attention_fwd dot_product_attention_bwd
        dot_product_attention_fwd_wrapper dot_product_attention_bwd_wrapper
        dot_product_attention_fp8_fwd dot_product_attention_fp8_bwd
        dot_product_attention_fp8_fwd_wrapper dot_product_attention_fp8_bwd_wrapper
        fft cholesky cholesky_update eig eigh lu qr svd schur hessenberg tridiagonal
        tridiagonal_solve triangular_solve householder_product geqrf geqp3 ormqr
        symmetric_product psum psum_invariant psum_start psum_done psum_invariant_start
        pmax pmin all_gather all_gather_start all_gather_done all_gather_invariant
        all_gather_reduced all_gather_reduced_start all_to_all all_to_all_start
        all_to_all_done ragged_all_to_all ppermute ppermute_start ppermute_done
        reduce_scatter reduce_scatter_start reduce_scatter_done pbroadcast
        pbroadcast_start pbroadcast_done pbroadcast_dynamic pvary preduced
        unreduced_psum unreduced_psum_start unreduced_pmax unreduced_pmin
        unreduced_reduce_scatter unreduced_reduce_scatter_start reduced_vary_cast
        reduced_vary_cast_p vary_unreduced_cast vary_unreduced_cast_p reshard
        layout_constraint relayout with_memory_space_constraint psend precv
        """,
    "no float": """
        eq ne lt le gt ge eq_to lt_to le_to and or not xor shift_left
        shift_right_arithmetic shift_right_logical population_count clz mulhi argmax
        argmin iota iota_2x32_shape is_finite reduce_and reduce_or reduce_xor
        random_bits random_seed random_split random_fold_in random_wrap random_unwrap
        random_clone threefry2x32 threefry4x32 philox2x32 philox4x32 rng_bit_generator
        rng_uniform lu_pivots_to_permutation axis_index platform_index create_token
        after_all debug_callback debug_print inspect_sharding shape_assertion
        dimension_size dim_as_value name dce_sink unreachable check tie pin unpin
        new_ref empty_ref free_ref get swap addupdate accum_grad_in_ref freeze
        new_box box_get box_set new_log log_read log_extend to_edtype from_edtype
        create_linear stage
        """,
    "walked": """
        jit closed_call call remat2 custom_jvp_call custom_vjp_call cond scan while
        shard_map
        """,
    "opaque": """
        custom_linear_solve custom_lin custom_jvp_call_jaxpr custom_vmap_call
        linear_call run_state core_map composite custom_partitioning call_exported
        remat_opt eval_jaxpr cudnn_fusion call_hi_primitive
        call_hi_primitive_linearized ffi_call pure_callback io_callback
        """,
}


def _table() -> dict[str, Kind]:
    table: dict[str, Kind] = {}
    for kind, names in _GROUPS.items():
        for name in names.split():
            if name in table:  # (one kind per primitive)
                raise AssertionError(f"{name} is listed as {table[name]} and {kind}")
            table[name] = kind
    return table


PRIMITIVES: MappingProxyType[str, Kind] = MappingProxyType(_table())
"""Every known primitive by name, with its kind."""

IDENTITIES = frozenset(n for n, k in PRIMITIVES.items() if k == "identity")
CUTS = frozenset(n for n, k in PRIMITIVES.items() if k == "cut")
CODE_MOVES = CUTS | frozenset(n for n, k in PRIMITIVES.items() if k == "code move")
MOVES = IDENTITIES | CODE_MOVES | frozenset(n for n, k in PRIMITIVES.items() if k == "move")
"""Primitives whose floating outputs are input elements moved, selected or negated."""
GRID = frozenset(n for n, k in PRIMITIVES.items() if k == "grid")


def kind_of(name: str) -> Kind | None:
    """The kind of the primitive named `name`, or None when the table does not hold it."""
    return PRIMITIVES.get(name)
