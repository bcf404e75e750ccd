"""llama.cpp itself, for the tests: `node-llama-cpp` in one Node process per test module.

`.ci/run` installs the npm package `node-llama-cpp` (prebuilt CPU builds of llama.cpp)
into a cache directory and exports its path as `PRECISION_NODE_LLAMA_CPP`; without
Node or the package the tests that need it skip, naming the command that installs it.
`LlamaCpp` drives `llama_cpp_server.mjs` over its standard input and output: load a
GGUF file (llama.cpp's warnings while loading come back), the raw next-token logits
after each token of a sequence, and llama.cpp's tokenization of a string.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

SERVER = Path(__file__).with_name("llama_cpp_server.mjs")
DEFAULT_HOME = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "precision-node"
INSTALL = (
    'npm install --prefix "${XDG_CACHE_HOME:-$HOME/.cache}/precision-node" node-llama-cpp '
    '&& export PRECISION_NODE_LLAMA_CPP="${XDG_CACHE_HOME:-$HOME/.cache}/precision-node"'
)


def home() -> Path | None:
    """Where node-llama-cpp is installed (its node_modules' parent), or None."""
    given = os.environ.get("PRECISION_NODE_LLAMA_CPP")
    root = Path(given) if given else DEFAULT_HOME
    found = (root / "node_modules" / "node-llama-cpp" / "package.json").is_file()
    return root if found and shutil.which("node") else None


def version() -> str:
    root = home()
    if root is None:
        return "not installed"
    package = root / "node_modules" / "node-llama-cpp" / "package.json"
    return str(json.loads(package.read_text())["version"])


class LlamaCpp:
    """One node-llama-cpp process; `close` ends it."""

    def __init__(self, root: Path):
        env = {**os.environ, "PRECISION_NODE_LLAMA_CPP": str(root)}
        self.proc = subprocess.Popen(
            ["node", str(SERVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )

    def _ask(self, **request) -> dict:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"node-llama-cpp ended: {err[-2000:]}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def load(self, path) -> list[tuple[str, str]]:
        """Load a GGUF file; llama.cpp's warnings and errors while it loaded."""
        return [tuple(x) for x in self._ask(op="load", path=str(path))["logs"]]

    def logits(self, tokens: list[int]) -> np.ndarray:
        """(tokens, vocab) float64: the logits of the next token after each token."""
        rows = self._ask(op="logits", tokens=[int(t) for t in tokens])["logits"]
        return np.array(rows, np.float64)

    def tokenize(self, text: str) -> list[int]:
        return list(self._ask(op="tokenize", text=text)["tokens"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def start() -> LlamaCpp:
    """A running llama.cpp, or the test skipped with the command that installs it."""
    root = home()
    if root is None:
        pytest.skip(f"llama.cpp through node-llama-cpp is not installed; run: {INSTALL}")
    return LlamaCpp(root)


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(p || q) per row, in nats, of two sets of logits (float64)."""
    lp = p_logits - np.logaddexp.reduce(p_logits, axis=-1, keepdims=True)
    lq = q_logits - np.logaddexp.reduce(q_logits, axis=-1, keepdims=True)
    out: np.ndarray = np.sum(np.exp(lp) * (lp - lq), axis=-1)
    return out
