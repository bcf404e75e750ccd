"""The names and sizes a checkpoint may hold: key paths as tensor names, and the
limits (`MAX_ARRAYS`, `MAX_NAME_LENGTH`, `MAX_RANK`, `MAX_ELEMENTS`,
`MAX_PATH_DEPTH`, `MAX_JSON_TOKENS` of `_layout`) checked before anything is
written or allocated.
"""

from __future__ import annotations

from typing import Any

from dtypes import CodebookFormat

from .._errors import SaveError
from ._layout import (
    MAX_ARRAYS,
    MAX_ELEMENTS,
    MAX_JSON_TOKENS,
    MAX_NAME_LENGTH,
    MAX_PATH_DEPTH,
    MAX_RANK,
    Leaf,
)

# --------------------------------------------------------------------------
# key paths


def path_name(path: tuple[tuple[str, Any], ...]) -> str:
    """The tensor name of a key path: its keys joined with dots ('tensor' for the root)."""
    return ".".join(str(key) for _, key in path) if path else "tensor"


def _specials(text: str) -> int:
    return text.count(",") + text.count("[") + text.count("{")


def _json_tokens_bound(spec: Leaf) -> int:
    """More than the `,` `[` `{` a leaf adds to a header (entries, metadata, CRCs)."""
    # (characters are counted in concatenations, once when none is there: fewer calls)
    arrays = spec.arrays()
    tokens = 60 + 4 * len(spec.path) + 2 * len(spec.shape)
    tokens += sum([8 + len(shape) for _, _, shape in arrays])
    if isinstance(spec.format, CodebookFormat):
        tokens += 2 * len(spec.format.values)
    keys = "".join([str(key) for _, key in spec.path])
    names = "".join([name for name, _, _ in arrays])
    format_name = "" if spec.format is None else spec.format.name
    if not _specials(spec.name + format_name + keys + names):
        return tokens
    return (
        tokens
        + 4 * _specials(spec.name)
        + 2 * _specials(format_name)
        + _specials(keys)
        + 3 * _specials(names)
    )


def check_limits(leaves: list[Leaf]) -> None:
    """Raise `SaveError` when leaves exceed what a checkpoint may hold (`MAX_*`)."""
    count = 0
    tokens = 0
    for spec in leaves:
        tokens += _json_tokens_bound(spec)
        if len(spec.path) > MAX_PATH_DEPTH:
            raise SaveError(
                f"cannot save {spec.name[:200]!r}: its key path has {len(spec.path)} keys, more "
                f"than a checkpoint's {MAX_PATH_DEPTH}; flatten the tree first"
            )
        for name, _, shape in spec.arrays():
            count += 1
            problem = name_problem(name) or shape_problem(shape)
            if problem is None and spec.shape != shape:
                problem = shape_problem(spec.shape)
            if problem is not None:
                raise SaveError(
                    f"cannot save {name[:200]!r}: {problem}; split the tree or the tensor"
                )
    if count > MAX_ARRAYS:
        raise SaveError(
            f"cannot save {count} arrays in one checkpoint (the limit is {MAX_ARRAYS}); save "
            "the tree in several files"
        )
    if tokens > MAX_JSON_TOKENS:
        raise SaveError(
            f"cannot save this tree in one checkpoint: its header would hold up to {tokens} "
            f"JSON values (the limit is {MAX_JSON_TOKENS}; deep key paths cost the most); "
            "save the tree in several files"
        )


def name_problem(name: str) -> str | None:
    """Why `name` cannot name an array in a checkpoint, or None."""
    if len(name) > MAX_NAME_LENGTH:
        return f"its name has {len(name)} characters, more than the limit of {MAX_NAME_LENGTH}"
    return None


def shape_problem(shape: tuple[int, ...]) -> str | None:
    """Why `shape` is beyond a checkpoint's limits (`MAX_RANK`, `MAX_ELEMENTS`), or None."""
    if len(shape) > MAX_RANK:
        return f"its shape has {len(shape)} dimensions, more than the limit of {MAX_RANK}"
    total = 1
    for d in shape:
        total *= max(d, 1)  # Python integers: no overflow
        if total > MAX_ELEMENTS:
            return (
                f"its shape {list(shape)!s:.200} exceeds the limit of 2**48 elements (zero "
                "dimensions counted as 1)"
            )
    return None


def check_names(leaves: list[Leaf]) -> None:
    """Raise `SaveError` when two stored arrays would share a name or the limits are exceeded."""
    check_limits(leaves)
    seen: dict[str, str] = {}
    for spec in leaves:
        for name, _, _ in spec.arrays():
            if name == "__metadata__" or name in seen:
                other = seen.get(name, "the header's metadata")
                raise SaveError(
                    f"two leaves would be stored under the name {name!r} ({other} and "
                    f"{spec.name}); rename one of the keys"
                )
            seen[name] = spec.name


def key_path_of(path: Any) -> tuple[tuple[str, Any], ...] | None:
    """A leaf's JSON key path as a key path, or None when it is not one (not a list of
    at most `MAX_PATH_DEPTH` pairs `["key" or "attr", string]` / `["key" or "index", int]`)."""
    if not isinstance(path, list) or len(path) > MAX_PATH_DEPTH:
        return None
    out = []
    for p in path:
        if not (
            isinstance(p, list)
            and len(p) == 2
            and (
                (p[0] in ("key", "attr") and isinstance(p[1], str))
                or (p[0] in ("key", "index") and type(p[1]) is int)
            )
        ):
            return None
        out.append((p[0], p[1]))
    return tuple(out)


def path_and_shape(
    path: Any, shape: Any, name: str
) -> tuple[tuple[tuple[str, Any], ...], tuple[int, ...]] | str:
    """A metadata leaf's key path (JSON `path`, which must give the leaf's `name`) and
    logical shape (JSON `shape`), or what is wrong with them."""
    key_path = key_path_of(path)
    if key_path is None:
        return f"bad key path {path!r:.200}"
    if path_name(key_path) != name:
        return f"key path {path!r:.200} does not give the name {name!r}"
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return f"bad shape {shape!r:.200}"
    problem = shape_problem(tuple(shape))
    if problem:
        return f"its logical shape: {problem}"
    return key_path, tuple(shape)
