"""Every code block and shell command of README.md and docs/*.md runs as copied.

The blocks are read from the pages themselves, so what runs is what a reader copies.
A fence's language says what its block is:

- ```` ```python ````: code. A block with `>>>` prompts is a doctest (its printed values
  are compared, with `...` and whitespace as doctest's ELLIPSIS and NORMALIZE_WHITESPACE
  allow); any other is a script. The python blocks of a page run in page order in one fresh
  interpreter and one namespace, as in a reader's session (JAX's default promotion, nothing
  measured yet), in an empty temporary directory. docs/cli.md runs a second time on 8 forced
  host devices (its Orbax example shards over every device).
- ```` ```console ````: a shell session: each line starting with `$ ` is a command (a
  trailing `\\` continues it), the other lines are its output, shown, not compared
  (timings, sizes and SQNR digits vary with the machine and the checkpoint's size).
- ```` ```bash ```` (`sh`, `shell`): every line is a command, but for `#` comments.
- Any other language (`text`, `json`, …) is an output sample or a file layout and never
  runs. A fence with no language is refused: every block says what it is.

Markers, an HTML comment on the line just before a fence (invisible on the site):

- `<!-- docs-test: skip REASON -->`: a python or shell block that must not run here; the
  reason is required and is the test's skip reason.
- `<!-- docs-test: heavy REASON -->`: runs only with `DOCS_TEST_HEAVY=1` (minutes of
  measurement, or an extra the test install lacks); skipped with the reason otherwise.
- `<!-- docs-test: output -->`: a `text` block that is exactly what the python script block
  before it prints; compared (whitespace aside).

Setup commands (a virtual environment made or activated, `pip install`, `apt-get`,
`playwright install`) are recognised and skipped, with the reason; .ci/run itself runs the
README's setup line.

Shell commands run with bash, one by one, in a temporary directory per page that holds
`docs/`, `benchmarks/`, `examples/` and `tests/` (links to this clone's), like a clone's
root; a page's commands share it, so `python docs/make_checkpoint.py gpt2` on docs/cli.md
makes the checkpoint its later commands convert. `PRECISION_DOCS_SMALL=1`, which the script
honours, makes that checkpoint small (two layers, 64 wide): the commands are the page's,
and take seconds. `DOCS_TEST_HEAVY=1` runs the heavy blocks and the full GPT-2 size.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")),
]
HEAVY = os.environ.get("DOCS_TEST_HEAVY") == "1"
EIGHT_DEVICES = ["docs/cli.md"]  # pages whose python blocks also run on 8 host devices
LINKED = ["docs", "benchmarks", "examples", "tests"]  # what a shell command may name
PYTHON = {"python"}
SHELL = {"console", "bash", "sh", "shell"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>.*)$")
MARKER = re.compile(r"^\s*<!-- docs-test: (?P<kind>skip|heavy|output)(?: (?P<reason>.*?))? -->\s*$")
SETUP = re.compile(
    r"(^|\s)(python3? -m venv|\. \S*/activate|source \S*/activate|pip3? install|"
    r"apt(-get)? install|playwright install)(\s|$)"
)


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    language: str
    source: str
    marker: str | None = None  # skip, heavy or output
    reason: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The fenced blocks of a page, with the marker on the line before each."""
    lines = (ROOT / page).read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        end = next(
            j for j in range(i + 1, len(lines)) if lines[j].strip() == fence
        )  # a fence closes on the same number of backticks
        body = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        marker = MARKER.match(lines[i - 1]) if i else None
        out.append(
            Block(
                page,
                i + 1,
                m["info"].strip().split(" ")[0],
                body,
                marker["kind"] if marker else None,
                marker["reason"] if marker else None,
            )
        )
        i = end + 1
    return out


def commands(block: Block) -> list[tuple[int, str]]:
    """(line, command) of each shell command of a console or bash block."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for k, line in enumerate(block.source.splitlines()):
        if not pending:
            if block.language == "console":
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            elif not line.strip() or line.lstrip().startswith("#"):
                continue
            start = block.line + 1 + k
        pending.append(line.removesuffix("\\"))
        if not line.endswith("\\"):
            out.append((start, " ".join(part.strip() for part in pending)))
            pending = []
    return out


ALL = {page: blocks(page) for page in PAGES}


def _skip_reason(block: Block) -> str | None:
    if block.marker == "skip":
        return f"{block.where}: {block.reason}"
    if block.marker == "heavy" and not HEAVY:
        return f"{block.where}: heavy ({block.reason}); DOCS_TEST_HEAVY=1 runs it"
    return None


# The extraction itself: what the markers and fences promise holds.


def test_every_fence_names_its_language():
    bare = [b.where for blocks_ in ALL.values() for b in blocks_ if not b.language]
    assert not bare, f"fences without a language (```text for output, ```python, …): {bare}"


def test_markers_are_well_formed():
    problems = []
    for page in PAGES:
        lines = (ROOT / page).read_text().splitlines()
        fenced = {b.line - 1 for b in ALL[page]}  # 1-based line of each marker's fence, less one
        for n, line in enumerate(lines, 1):
            if "docs-test:" not in line:
                continue
            m = MARKER.match(line)
            if not m:
                problems.append(f"{page}:{n}: not `<!-- docs-test: skip|heavy|output REASON -->`")
            elif n not in fenced:
                problems.append(f"{page}:{n}: the marker is not on the line before a fence")
            elif m["kind"] in ("skip", "heavy") and not m["reason"]:
                problems.append(f"{page}:{n}: `{m['kind']}` needs a reason")
    for page_blocks in ALL.values():
        for before, block in itertools.pairwise(page_blocks):
            if block.marker == "output" and (
                before.language != "python" or ">>>" in before.source or block.language != "text"
            ):
                problems.append(f"{block.where}: `output` marks a text block after a script")
    assert not problems, "\n".join(problems)


def test_the_pages_hold_what_this_test_runs():
    # If the extraction broke, everything below would pass by running nothing.
    kinds = [b.language for page_blocks in ALL.values() for b in page_blocks]
    assert kinds.count("python") > 60
    cli = [c for b in ALL["docs/cli.md"] if b.language in SHELL for _, c in commands(b)]
    assert cli[0] == "python docs/make_checkpoint.py gpt2"
    # every conversion reads a checkpoint the page made before it
    made: set[str] = set()
    for c in cli:
        if c.startswith("python docs/make_checkpoint.py"):
            made.add(c.split()[2])
        elif c.startswith("precision convert"):
            assert c.split()[2].split("/")[0] in made, (c, made)


# Python blocks: one interpreter per page.

RUNNER = textwrap.dedent(
    """
    import contextlib, doctest, io, json, sys, traceback

    page, blocks = sys.argv[1], json.load(sys.stdin)
    ns = {"__name__": "__main__"}
    failures = []
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    for b in blocks:
        where = f"{page}:{b['line']}"
        if b["doctest"]:
            test = doctest.DocTestParser().get_doctest(b["source"], ns, where, page, b["line"])
            runner = doctest.DocTestRunner(optionflags=flags)
            report = []
            runner.run(test, out=report.append, clear_globs=False)
            ns = test.globs  # a DocTest works on a copy: the names it made carry on
            if runner.failures:
                failures.append("".join(report))
            continue
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(b["source"], where, "exec"), ns)
        except BaseException:
            failures.append(f"{where}: the block raised\\n{traceback.format_exc()}")
        expected = b["output"]
        if expected is not None and printed.getvalue().split() != expected.split():
            failures.append(
                f"{where}: printed\\n{printed.getvalue()}\\nwhere the page shows\\n{expected}"
            )
    print(json.dumps(failures))
    """
)


def run_python(page: str, tmp_path: Path, devices: int = 1) -> list[str]:
    """Run a page's python blocks in a fresh interpreter; return its failure reports."""
    page_blocks = ALL[page]
    todo = []
    for k, block in enumerate(page_blocks):
        if block.language not in PYTHON or _skip_reason(block):
            continue
        after = page_blocks[k + 1] if k + 1 < len(page_blocks) else None
        output = after.source if after is not None and after.marker == "output" else None
        doctest_ = ">>>" in block.source
        todo.append(
            {"line": block.line, "source": block.source, "doctest": doctest_, "output": output}
        )
    if not todo:
        pytest.skip(f"{page} has no python block to run")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, page],
        input=json.dumps(todo),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"{page}: the interpreter failed\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.language in PYTHON for b in ALL[p])])
def test_python_blocks(page, tmp_path):
    failures = run_python(page, tmp_path)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("page", EIGHT_DEVICES)
def test_python_blocks_on_8_devices(page, tmp_path):
    failures = run_python(page, tmp_path, devices=8)
    assert not failures, "\n".join(failures)


def test_a_broken_example_is_reported(tmp_path, monkeypatch):
    # The runner itself: a wrong doctest value, a raising script and a wrong printed output
    # are each a failure, named by page and line.
    page = "docs/broken.md"
    fake = [
        Block(page, 3, "python", ">>> 1 + 1\n3\n"),
        Block(page, 9, "python", "print('hi')\nraise ValueError('boom')\n"),
        Block(page, 15, "python", "print(2)\n"),
        Block(page, 19, "text", "3\n", "output"),
    ]
    monkeypatch.setitem(ALL, page, fake)
    failures = run_python(page, tmp_path)
    assert len(failures) == 3, failures
    assert "line 4" in failures[0]  # doctest names the example's line
    assert "Expected:\n    3\nGot:\n    2" in failures[0]
    assert failures[1].startswith(f"{page}:9: the block raised")
    assert "boom" in failures[1]
    assert failures[2].startswith(f"{page}:15: printed\n2")


# Shell commands: one directory per page, in page order.

SHELL_COMMANDS = [
    (page, block, line, command)
    for page in PAGES
    for block in ALL[page]
    if block.language in SHELL
    for line, command in commands(block)
]


@pytest.fixture(scope="module")
def page_dirs(tmp_path_factory):
    """One working directory per page, shaped like a clone's root (links to its folders)."""
    made: dict[str, Path] = {}

    def get(page: str) -> Path:
        if page not in made:
            where = tmp_path_factory.mktemp(page.replace("/", "_"))
            for name in LINKED:
                (where / name).symlink_to(ROOT / name, target_is_directory=True)
            made[page] = where
        return made[page]

    return get


@pytest.mark.parametrize(
    ("page", "block", "line", "command"),
    SHELL_COMMANDS,
    ids=[f"{page}:{line}" for page, _, line, _ in SHELL_COMMANDS],
)
def test_shell_command(page, block, line, command, page_dirs):
    if reason := _skip_reason(block):
        pytest.skip(reason)
    if SETUP.search(command):
        pytest.skip(f"{page}:{line}: setup, not run here (.ci/run runs the README's): {command}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if not HEAVY:
        env["PRECISION_DOCS_SMALL"] = "1"
    env.pop("XLA_FLAGS", None)
    result = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        cwd=page_dirs(page),
        env=env,
        timeout=1800 if HEAVY else 300,
        check=False,
    )
    assert result.returncode == 0, (
        f"{page}:{line}: `{command}` exited with {result.returncode}\n"
        f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-3000:]}"
    )
