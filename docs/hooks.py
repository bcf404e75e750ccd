"""mkdocs hooks: the format table comes from the registry, and the API reference is complete.

Registered in mkdocs.yml under `hooks:`. Two jobs:

* `on_page_markdown` replaces the marker `<!-- format-table -->` with tables
  built from `dtypes.FORMATS` (one per family, sized for a 1280-px page), so the docs
  cannot drift from the code.
* `on_page_markdown` also replaces `<!-- api-index -->` on api/index.md with a table per
  API page: each public name documented there, linked, with its docstring's first line.
* `on_post_page` collects the entries (`id="module.name"`) of the rendered API pages
  (api/*.md) and `on_post_build` checks that every name in `dtypes.__all__`,
  `precision.__all__`, `precision.testing.__all__` and `precision.optax.__all__` has one,
  on exactly one page; a missing or repeated one is a warning, which
  `mkdocs build --strict` turns into a failure.
"""

from __future__ import annotations

import decimal
import html
import importlib
import logging
import math
import re
from pathlib import Path

import numpy as np

import dtypes

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- format-table -->"
MX_MARKER = "<!-- mx-table -->"
API_DIR = "api/"
API_INDEX = "api/index.md"
API_MARKER = "<!-- api-index -->"
PUBLIC_MODULES = ("dtypes", "precision", "precision.testing", "precision.optax")

log = logging.getLogger("mkdocs.plugins.precision")

#: The generated tables, one per family, each narrow enough for a 1280-px page (the
#: content column is about 690 px there: docs/screenshots.py checks it). Floats take two
#: tables: what they are, and their numbers.
FLOAT_COLUMNS = ("name", "aliases", "bits", "container", "notes")
NUMBER_COLUMNS = ("name", "max", "min_normal", "smallest_subnormal", "eps")
INT_COLUMNS = ("name", "aliases", "bits", "container", "qmax", "notes")

#: The class of the block around each generated table: docs/stylesheets/extra.css keeps the
#: names and numbers in it whole (a cell wraps between words, never inside a name).
TABLE_CLASS = "format-table"


def number(value: float) -> str:
    """A table cell for a positive float, exact before any `≈`.

    Short exact decimals stay as they are (`448`, `0.125`); powers of two become
    `2^-126 ≈ 1.18e-38`; the largest value of a wide format becomes
    `(2 - 2^-7) × 2^127 ≈ 3.39e+38`.
    """
    exact = repr(value)
    if len(exact) <= 8 and decimal.Decimal(exact) == decimal.Decimal(value):
        return exact[:-2] if exact.endswith(".0") else exact
    mantissa, exponent = math.frexp(value)  # value = mantissa * 2**exponent, 0.5 <= mantissa < 1
    if mantissa == 0.5:
        return f"2^{exponent - 1} ≈ {value:.3g}"
    gap = 2.0 - 2 * mantissa  # the significand is 2 - gap
    k = -math.frexp(gap)[1] + 1
    if gap == math.ldexp(1.0, -k):
        return f"(2 - 2^-{k}) × 2^{exponent - 1} ≈ {value:.4g}"
    return f"{value:.6g}"


def notes(fmt: dtypes.Format) -> str:
    """What sets the format apart, derived from its attributes."""
    if fmt.kind == "int":
        if fmt.binary:
            return "binary ±1 codes (0 → +1), scale mean(\\|x\\|) per group; 8 codes per byte"
        text = f"symmetric codes in [-{fmt.qmax}, {fmt.qmax}], scale absmax/{fmt.qmax} per group"
        if fmt.packed:
            text += f"; {8 // fmt.bits} codes per byte"
        return text
    parts = []
    if fmt.is_full_precision:
        parts.append("full precision (a logical dtype)")
    if fmt.native_dtype is None:
        if fmt.container == np.float32:
            low = 23 - fmt.mantissa_bits
            parts.append(f"no native dtype: float32 container, low {low} mantissa bits zero")
        elif fmt.packed:
            parts.append(f"no native dtype: own bit codes, {8 // fmt.code_bits} per byte")
        else:
            parts.append(f"no native dtype: own bit codes, one per {fmt.container.name}")
    parts.append("±inf and NaN" if fmt.has_inf else ("NaN, no inf" if fmt.nan else "no inf/NaN"))
    if fmt.saturate:
        parts.append("saturates to ±max")
    return "; ".join(parts)


def _aliases() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for alias, name in dtypes.ALIASES.items():
        out.setdefault(name, []).append(alias)
    return out


def _code(*names: str) -> str:
    return ", ".join(f"`{n}`" for n in names)


def float_rows() -> list[tuple[str, ...]]:
    """What each float format is, in registry order: `FLOAT_COLUMNS`."""
    aliases = _aliases()
    return [
        (
            _code(name),
            _code(*aliases.get(name, [])),
            str(fmt.bits),
            _code(fmt.container.name),
            notes(fmt),
        )
        for name, fmt in dtypes.FORMATS.items()
        if fmt.kind == "float"
    ]


def number_rows() -> list[tuple[str, ...]]:
    """The range and precision of each float format: `NUMBER_COLUMNS`."""
    return [
        (
            _code(name),
            number(fmt.max),
            number(fmt.min_normal),
            number(fmt.smallest_subnormal),
            number(fmt.eps),
        )
        for name, fmt in dtypes.FORMATS.items()
        if fmt.kind == "float"
    ]


def int_rows() -> list[tuple[str, ...]]:
    """Each integer format, in registry order: `INT_COLUMNS`."""
    aliases = _aliases()
    return [
        (
            _code(name),
            _code(*aliases.get(name, [])),
            str(fmt.bits),
            _code(fmt.container.name) + (" (packed)" if fmt.packed else ""),
            str(fmt.qmax),
            notes(fmt),
        )
        for name, fmt in dtypes.FORMATS.items()
        if fmt.kind == "int"
    ]


def table(columns: tuple[str, ...], rows: list[tuple[str, ...]], code: bool = False) -> str:
    """A Markdown table; with `code`, the headers after the first are attribute names."""
    head = [c if i == 0 or not code else f"`{c}`" for i, c in enumerate(columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def format_table() -> str:
    """The tables of every registered format, one family each, under their own headings."""
    kinds = {fmt.kind for fmt in dtypes.FORMATS.values()}
    assert kinds == {"float", "int"}, f"docs/hooks.py has no table for kinds {kinds}"
    parts = [
        ("Floating-point formats", table(FLOAT_COLUMNS, float_rows())),
        ("Their range and precision", table(NUMBER_COLUMNS, number_rows(), code=True)),
        ("Integer formats", table(INT_COLUMNS, int_rows())),
    ]
    return "\n\n".join(
        f'### {title}\n\n<div class="{TABLE_CLASS}" markdown>\n\n{body}\n\n</div>'
        for title, body in parts
    )


#: The OCP microscaling compositions: an element format and power-of-two scales per 32.
MX = {
    "MXFP8 (E4M3)": "float8_e4m3fn",
    "MXFP8 (E5M2)": "float8_e5m2",
    "MXFP6 (E3M2)": (3, 2),
    "MXFP6 (E2M3)": (2, 3),
    "MXFP4": (2, 1),
    "MXINT8": "int8",
}
MX_SHAPE = (1024, 1024)


def mx_formats() -> dict[str, dtypes.Format]:
    """The element format of each MX composition."""
    return {
        name: dtypes.get(spec) if isinstance(spec, str) else dtypes.FloatFormat(*spec, finite=True)
        for name, spec in MX.items()
    }


MX_NAMED = {
    "MXFP8 (E4M3)": "mxfp8_e4m3",
    "MXFP8 (E5M2)": "mxfp8_e5m2",
    "MXFP6 (E3M2)": "mxfp6_e3m2",
    "MXFP6 (E2M3)": "mxfp6_e2m3",
    "MXFP4": "mxfp4",
    "MXINT8": "mxint8",
    "NVFP4": "nvfp4",
}


def mx_table() -> str:
    """Markdown table of the MX and NVFP4 compositions and their real footprint, from `nbytes`."""
    n = MX_SHAPE[0] * MX_SHAPE[1]
    lines = [
        "| composition | registry name | element layout | scales | bytes of a 1024×1024 tensor "
        "| bits per value, scales included |",
        "|---|---|---|---|---|---|",
    ]
    for label, name in MX_NAMED.items():
        fmt = dtypes.get(name)
        nbytes = fmt.nbytes(MX_SHAPE)
        element = f"{fmt.bits}-bit" + (" packed" if fmt.packed else "")
        sc = fmt.scaling
        scales = f"`{sc.scale_format}` per {sc.size}" + (
            " × one float32 per tensor" if sc.scale_format == "float8_e4m3fn" else ""
        )
        lines.append(
            f"| {label} | `{name}` | {element} | {scales} | {nbytes:,} | {nbytes * 8 / n:g} |"
        )
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, format_table())
    if MX_MARKER in markdown:
        markdown = markdown.replace(MX_MARKER, mx_table())
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, api_index(api_pages(config), config["docs_dir"]))
    return markdown


def public_names() -> dict[str, list[str]]:
    """`__all__` of each public module that can be imported."""
    names = {}
    for module_name in PUBLIC_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            log.warning(f"cannot import {module_name} to check its API reference: {error}")
            continue
        names[module_name] = list(getattr(module, "__all__", []))
    return names


DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", flags=re.MULTILINE)
OPTIONS = re.compile(r"(?:[ \t]+\S.*\n?)*")  # the indented lines under a directive


def api_pages(config) -> list[tuple[str, str]]:
    """(path under docs/, title) of each API page but the index, in the order of the nav."""

    def walk(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            title = next(iter(item)) if isinstance(item, dict) else None
            if isinstance(value, list):
                yield from walk(value)
            elif value.startswith(API_DIR) and value != API_INDEX:
                yield value, title

    return list(walk(config["nav"]))


def documented(source: str) -> list[str]:
    """The qualified names a page's `::: name` directives document (a module: its `__all__`,
    unless its options say `members: false`: then only its docstring, which has no entry)."""
    names = []
    for match in DIRECTIVE.finditer(source):
        target = match.group(1)
        if target in PUBLIC_MODULES:
            options = OPTIONS.match(source, match.end() + 1)
            if options and re.search(r"^\s+members:\s*false\s*$", options.group(0), re.M):
                continue
            names += [f"{target}.{n}" for n in importlib.import_module(target).__all__]
        else:
            names.append(target)
    return names


def summary(qualified: str) -> str:
    """The first line of a public name's docstring, as the API pages show it."""
    obj = _griffe(qualified.split(".")[0])[qualified.split(".", 1)[1]]
    text = obj.docstring.value if obj.docstring else ""
    return text.strip().split("\n")[0].replace("|", "\\|")


def _griffe(top: str):
    import griffe

    if top not in _LOADED:
        loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
        for package in ("dtypes", "precision"):
            loader.load(package)
        loader.resolve_aliases(external=True)
        _LOADED.update({p: loader.modules_collection[p] for p in ("dtypes", "precision")})
    return _LOADED[top]


_LOADED: dict = {}


def api_index(pages: list[tuple[str, str]], docs_dir: str) -> str:
    """A table per API page: its names, linked to their entries, and what each is."""
    parts = []
    for path, title in pages:
        with open(f"{docs_dir}/{path}") as f:
            names = documented(f.read())
        link = path.removeprefix(API_DIR)
        rows = [f"| [`{n}`]({link}#{n}) | {summary(n)} |" for n in names]
        parts.append(
            f'## [{title}]({link})\n\n<div class="api-index" markdown>\n\n'
            "| name | what it is |\n|---|---|\n" + "\n".join(rows) + "\n\n</div>"
        )
    return "\n\n".join(parts)


def entries(rendered_html: str) -> set[str]:
    """The ids of a rendered page: an API entry's is its qualified name."""
    return {html.unescape(i) for i in re.findall(r'id="([^"]+)"', rendered_html)}


def missing_from_api(found: dict[str, set[str]]) -> list[str]:
    """Public names with no entry on any API page, then those with one on several."""
    problems = []
    for module, names in public_names().items():
        for name in names:
            qualified = f"{module}.{name}"
            pages = sorted(page for page, ids in found.items() if qualified in ids)
            if not pages:
                problems.append(f"API reference has no entry for public name {qualified}")
            elif len(pages) > 1:
                problems.append(f"public name {qualified} has an entry on {', '.join(pages)}")
    return problems


_FOUND: dict[str, set[str]] = {}  # API page -> the ids rendered on it, this build


def on_pre_build(config) -> None:
    _FOUND.clear()


def on_post_page(output: str, page, config) -> str:
    uri = page.file.src_uri
    if uri.startswith(API_DIR) and uri != API_INDEX:
        _FOUND[uri] = entries(output)
    return output


def on_post_build(config) -> None:
    if not _FOUND:
        log.warning("no API page (docs/api/*.md) was rendered: cannot check the API reference")
    for problem in missing_from_api(_FOUND):
        log.warning(problem)
