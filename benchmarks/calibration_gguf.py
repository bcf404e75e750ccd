"""Calibrated Q4_0 in llama.cpp: GPTQ and AWQ against ggml's own round-to-nearest.

Run:  python benchmarks/calibration_gguf.py            # the 6-layer model of calibration.py
      python benchmarks/calibration_gguf.py --small    # 4 layers, d 128
      python benchmarks/calibration_gguf.py --quick    # 2 layers, d 64: a minute or two

The byte-level model of `benchmarks/calibration.py` (trained there, or loaded from its
cache) is a GPT-2 in all but its vocabulary's text: pre-LayerNorm blocks, learned
positions, biases on every projection, GELU (tanh), no bias on its head. It is written as
a Hugging Face GPT-2 directory (q, k and v fused into `c_attn`; the tokenizer a byte-level
BPE whose first 256 ids are the bytes, plus the one merge and the end-of-text token
llama.cpp's reader needs) and converted with `precision convert --layout gguf`:

* F32: `--to float32`;
* RTN Q4_0: the F32 file's matrices quantized by the `gguf` package's Q4_0 (ggml's rule:
  per block of 32, `d = max / -8` of the signed value of largest magnitude, codes 0..15
  for -8..7), embeddings and norms left F32 as in the others; and "(convert)", `precision
  convert --layout gguf --preset q4_0` of the same directory, which rounds by that rule;
* GPTQ Q4_0, AWQ Q4_0, AWQ+GPTQ Q4_0: `precision.calibrate(format="q4_0")` with
  `method="gptq"`, `"awq"` and `"awq+gptq"`, rounding onto Q4_0's own grid
  in blocks of 32 inputs, written by `convert` as they are; "(int4 grid)": the same with
  `format="int4"` (codes -7..7 times `absmax / 7`: a subset of Q4_0's, one level short);
  "GPTQ Q4_0 (paper)": GPTQ as published (`act_order=False, clip=False`: inputs in
  order, each block's whole range), where the default visits inputs by decreasing energy
  and searches each block's clipped range.

llama.cpp (node-llama-cpp, `tests/precision/llama_cpp.py`) runs each file on the held-out
windows of `calibration.py` and gives bits per byte, with the loss against F32 paired
over the windows. Our JAX forward of the same weights is shown beside it ("(JAX)" rows: the
same F32 weights and the same RTN, GPTQ and AWQ codes), with one difference in what is
computed: llama.cpp's Q4_0 dots round their activations to Q8_0 (blocks of 32, int8 with
an absmax scale) on the CPU, ours keep them in float32.
Target: GPTQ, AWQ and AWQ+GPTQ Q4_0 lose at most half of what RTN Q4_0 loses.

Then the same rows (F32, RTN, GPTQ, AWQ and AWQ+GPTQ Q4_0; `--no-outliers` skips them) for the
same model given activation outlier channels (`calibration.with_outliers`: a few
LayerNorm features 128x larger, the weight rows reading them 128x smaller; float32 bits
unchanged, so F32 gives the same bits per byte): the case AWQ exists for, as large
language models grow such channels.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import dtypes
import precision
from precision._cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests" / "precision")]
import calibration as bench  # noqa: E402
import llama_cpp  # noqa: E402

EOT = bench.VOCAB - 1  # "<|endoftext|>"; VOCAB - 2 is the merged "ĠĠ"
SCALING = dtypes.PerBlock(32, scale_format="float16")


# --------------------------------------------------------------------------
# the Hugging Face GPT-2 directory


def byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: the character standing for each byte 0..255 (printable
    Latin-1 bytes stand for themselves, the others for 256, 257, ... in byte order)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    symbols = byte_symbols()
    space = symbols[ord(" ")]
    vocab = {s: i for i, s in enumerate(symbols)} | {space + space: bench.VOCAB - 2}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(space, space)]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path))


def _codes(t: precision.Tensor) -> tuple[np.ndarray, ...]:
    """(integer codes, float16 scales, zero points) of an int4 Tensor (zero points 0) or
    a uint4 one (Q4_0's grid) blocked along axis 0."""
    scale = np.asarray(t.encoded.scale)
    zp = t.encoded.zero_point
    zero = np.zeros(scale.shape, np.int16) if zp is None else np.asarray(zp).astype(np.int16)
    step = np.repeat(scale.astype(np.float32), 32, axis=0)[: t.shape[0]]
    offset = np.repeat(zero, 32, axis=0)[: t.shape[0]]
    return (np.rint(np.asarray(t.numpy()) / step) + offset).astype(np.int16), scale, zero


def _tensor(codes, scale, zero, axis: int, fmt: str) -> precision.Tensor:
    scaling = dtypes.PerBlock(32, axis, scale_format="float16")
    zero_point = zero if fmt == "uint4" else None
    enc = dtypes.from_codes(codes, scale, fmt, scaling, zero_point=zero_point)
    return precision.Tensor.from_encoded(enc)


def joined(parts: list) -> object:
    """Kernels (inputs, outputs) side by side along their outputs, codes kept."""
    if not isinstance(parts[0], precision.Tensor):
        return np.concatenate([np.asarray(p) for p in parts], axis=1)
    pieces = zip(*(_codes(p) for p in parts), strict=True)
    codes, scales, zeros = (np.concatenate(x, axis=1) for x in pieces)
    return _tensor(codes, scales, zeros, 0, parts[0].format.name)


def flipped(kernel) -> object:
    """A head kernel (inputs, outputs) as a Linear weight (outputs, inputs), codes kept."""
    if not isinstance(kernel, precision.Tensor):
        return np.ascontiguousarray(np.asarray(kernel).T)
    codes, scale, zero = (np.ascontiguousarray(x.T) for x in _codes(kernel))
    return _tensor(codes, scale, zero, 1, kernel.format.name)


def hf_tree(params, cfg: bench.Config) -> dict:
    """The Flax parameters (float or calibrated) under GPT-2's Hugging Face names."""
    p = params["params"]
    out = {
        "wte.weight": np.asarray(p["Embed_0"]["embedding"]),
        "wpe.weight": np.asarray(p["pos"]),
        "ln_f.weight": np.asarray(p["LayerNorm_0"]["scale"]),
        "ln_f.bias": np.asarray(p["LayerNorm_0"]["bias"]),
        "lm_head.weight": flipped(p["Dense_0"]["kernel"]),
    }
    for i in range(cfg.layers):
        b, h = p[f"Block_{i}"], f"h.{i}."
        out |= {
            h + "ln_1.weight": np.asarray(b["LayerNorm_0"]["scale"]),
            h + "ln_1.bias": np.asarray(b["LayerNorm_0"]["bias"]),
            h + "attn.c_attn.weight": joined([b[f"Dense_{j}"]["kernel"] for j in range(3)]),
            h + "attn.c_attn.bias": np.concatenate([b[f"Dense_{j}"]["bias"] for j in range(3)]),
            h + "attn.c_proj.weight": b["Dense_3"]["kernel"],
            h + "attn.c_proj.bias": np.asarray(b["Dense_3"]["bias"]),
            h + "ln_2.weight": np.asarray(b["LayerNorm_1"]["scale"]),
            h + "ln_2.bias": np.asarray(b["LayerNorm_1"]["bias"]),
            h + "mlp.c_fc.weight": b["Dense_4"]["kernel"],
            h + "mlp.c_fc.bias": np.asarray(b["Dense_4"]["bias"]),
            h + "mlp.c_proj.weight": b["Dense_5"]["kernel"],
            h + "mlp.c_proj.bias": np.asarray(b["Dense_5"]["bias"]),
        }
    return {k: v if isinstance(v, precision.Tensor) else np.asarray(v) for k, v in out.items()}


def write_hf(directory: Path, tree: dict, cfg: bench.Config) -> None:
    directory.mkdir(parents=True)
    precision.save(directory / "model.safetensors", tree)
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_embd": cfg.width,
        "n_layer": cfg.layers,
        "n_head": cfg.heads,
        "n_positions": cfg.context,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-6,  # Flax's LayerNorm
        "vocab_size": bench.VOCAB,
        "bos_token_id": EOT,
        "eos_token_id": EOT,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(directory / "tokenizer.json")


def convert(directory: Path, out: Path, *flags: str) -> None:
    argv = ["convert", str(directory), "-o", str(out), "--layout", "gguf", "-q", *flags]
    if cli(argv) != 0:
        raise RuntimeError(f"precision {' '.join(argv)} failed")


def ggml_rtn(f32: Path, out: Path) -> None:
    """The F32 file with its matrices (not the embeddings) quantized by the `gguf`
    package's Q4_0: llama.cpp's own round-to-nearest."""
    import gguf

    reader = gguf.GGUFReader(str(f32))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch=arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = 2 if key == "general.file_type" else field.contents()  # MOSTLY_Q4_0
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        values = np.array(t.data, np.float32).reshape(shape)
        if len(shape) == 2 and t.name not in ("token_embd.weight", "position_embd.weight"):
            q4 = gguf.GGMLQuantizationType.Q4_0
            writer.add_tensor(t.name, gguf.quants.quantize(values, q4), raw_dtype=q4)
        else:
            writer.add_tensor(t.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# --------------------------------------------------------------------------
# bits per byte


def llama_bits(server: llama_cpp.LlamaCpp, path: Path, xy: np.ndarray) -> np.ndarray:
    """Bits per byte of each held-out window, as llama.cpp computes the model in `path`."""
    logs = server.load(path)
    if logs:
        print(f"  llama.cpp said while loading {path.name}: {logs}")
    out = []
    for window in xy:
        logits = server.logits(window[:-1].tolist())
        logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
        out.append(-np.mean(logp[np.arange(len(window) - 1), window[1:]]) / math.log(2))
    return np.array(out)


def calibrated(f, params, batches, method: str, fmt: str):
    method, options = bench.PAPER.get(method, (method, {}))
    start = time.perf_counter()
    q = precision.calibrate(
        f, params, batches, method=method, format=fmt, scaling=SCALING, **options
    )
    jax.block_until_ready(q)
    return q, time.perf_counter() - start


def rows(cfg: bench.Config, args, server, work: Path) -> dict[str, tuple]:
    data = bench.stdlib_bytes()
    cut = int(0.9 * len(data))
    train, held = data[:cut], data[cut:]
    params, f = bench.trained(cfg, train, args.retrain), bench.model_of(cfg).apply
    starts = np.linspace(0, len(held) - cfg.context - 1, args.eval_windows).astype(int)
    xy = bench.windows(held, starts, cfg.context + 1)
    rng = np.random.default_rng(cfg.seed + 1)
    batches = [
        bench.windows(train, rng.integers(0, cut - cfg.context, 8), cfg.context)
        for _ in range(args.calib_batches)
    ]
    params = jax.tree.map(jnp.asarray, params)
    results: dict[str, tuple] = {}
    for suffix, model in (("", params), (OUTLIERS, bench.with_outliers(params, cfg))):
        if suffix and not args.outliers:
            continue
        tag = suffix.replace(" + ", "-").replace(" ", "")
        write_hf(work / f"f32{tag}", hf_tree(model, cfg), cfg)
        convert(work / f"f32{tag}", work / f"f32{tag}.gguf", "--to", "float32")
        results["float32 (JAX)" + suffix] = (bench.evaluate(f, model, xy), None)
        results["F32" + suffix] = (llama_bits(server, work / f"f32{tag}.gguf", xy), None)
        ggml_rtn(work / f"f32{tag}.gguf", work / f"rtn{tag}.gguf")
        results["RTN Q4_0 (ggml)" + suffix] = (
            llama_bits(server, work / f"rtn{tag}.gguf", xy),
            None,
        )
        # this library's own round-to-nearest Q4_0: ggml's rule, so the same file's numbers
        convert(work / f"f32{tag}", work / f"cli{tag}.gguf", "--preset", "q4_0")
        results["RTN Q4_0 (convert)" + suffix] = (
            llama_bits(server, work / f"cli{tag}.gguf", xy),
            None,
        )
        # the same codes in our forward, which keeps the activations in float32 where
        # llama.cpp's Q4_0 dots round them to Q8_0 (blocks of 32, int8, absmax scales)
        q, _ = calibrated(f, model, batches, "rtn", "q4_0")
        results["RTN q4_0 (JAX)" + suffix] = (bench.evaluate(precision.apply(f), q, xy), None)
        # (GPTQ as published, and the int4-grid rows, on the plain model only)
        methods = ["gptq", "gptq-paper", "awq", "awq+gptq"] if not suffix else []
        runs = [(m, "q4_0") for m in methods or ["gptq", "awq", "awq+gptq"]]
        runs += [("gptq", "int4"), ("awq", "int4")] if not suffix else []
        for method, fmt in runs:
            q, took = calibrated(f, model, batches, method, fmt)
            name = f"{method}-{fmt}{tag}".replace("+", "-")
            write_hf(work / name, hf_tree(q, cfg), cfg)
            convert(work / name, work / f"{name}.gguf", "--preset", "q4_0")
            kind = "GPTQ" if method.startswith("gptq") else method.upper()
            row = f"{kind} Q4_0" + (" (paper)" if method == "gptq-paper" else "")
            row += "" if fmt == "q4_0" else " (int4 grid)"
            results[row + suffix] = (llama_bits(server, work / f"{name}.gguf", xy), took)
            if fmt == "q4_0" and method != "gptq-paper":
                run = precision.apply(f)
                results[f"{kind} q4_0 (JAX){suffix}"] = (bench.evaluate(run, q, xy), took)
    return results


# The rows of the same model with activation outlier channels (`calibration.with_outliers`)
OUTLIERS = " + outliers"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 layers, d 64, 20 s of training")
    parser.add_argument(
        "--small", action="store_true", help="4 layers, d 128 (a busy machine trains it in time)"
    )
    parser.add_argument("--retrain", action="store_true", help="ignore the cached weights")
    parser.add_argument("--train-minutes", type=float, default=15.0)
    parser.add_argument("--train-steps", type=int, default=None, help=bench.STEPS_HELP)
    parser.add_argument("--eval-windows", type=int, default=None, help="default 128 (quick: 32)")
    parser.add_argument("--calib-batches", type=int, default=16, help="of 8 windows each")
    parser.add_argument(
        "--no-outliers",
        dest="outliers",
        action="store_false",
        help="skip the rows of the model given activation outlier channels",
    )
    args = parser.parse_args(argv)
    if args.quick:
        cfg = bench.Config(
            layers=2, width=64, heads=4, context=64, lr=3e-3, minutes=1 / 3, steps=args.train_steps
        )
        args.eval_windows = args.eval_windows or 32
    elif args.small:
        minutes, steps = args.train_minutes, args.train_steps
        cfg = bench.Config(layers=4, width=128, heads=4, lr=3e-3, minutes=minutes, steps=steps)
        args.eval_windows = args.eval_windows or 128
    else:
        cfg = bench.Config(minutes=args.train_minutes, steps=args.train_steps)
        args.eval_windows = args.eval_windows or 128
    if args.train_steps is not None and args.train_steps < 1:
        parser.error("--train-steps must be at least 1")
    if llama_cpp.home() is None:
        print(f"llama.cpp (node-llama-cpp) is not installed; run: {llama_cpp.INSTALL}")
        return 1
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"python {platform.python_version()}, jax {jax.__version__}, precision "
        f"{precision.__version__}, node-llama-cpp {llama_cpp.version()}, gguf "
        f"{bench.version('gguf')}; load {os.getloadavg()[0]:.1f}"
    )
    print(f"model: {cfg}")
    server = llama_cpp.LlamaCpp(llama_cpp.home())
    work = Path(tempfile.mkdtemp(prefix="calibration-gguf-"))
    try:
        results = rows(cfg, args, server, work)
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\n{len(results['F32'][0])} held-out windows of {cfg.context} bytes; loss = bit/B over F32"
    )
    width = max(map(len, results))
    print(f"{'row':<{width}} {'bit/B':>8} {'loss':>8} {'2 se':>7} {'calib s':>8}")
    for row, (bits, took) in results.items():
        suffix = OUTLIERS if row.endswith(OUTLIERS) else ""
        base = results[("float32 (JAX)" if "JAX" in row else "F32") + suffix][0]
        bench.print_row(row, bits, took, base, width)
    print("\ntargets (llama.cpp, against F32):")
    for suffix in ("", OUTLIERS) if args.outliers else ("",):
        for row in ("GPTQ Q4_0", "AWQ Q4_0", "AWQ+GPTQ Q4_0"):
            check = bench.half_check(
                results, row + suffix, "RTN Q4_0 (ggml)" + suffix, "F32" + suffix
            )
            print(f"  {row + suffix} loses <= half of RTN Q4_0 (ggml){suffix}: {check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
