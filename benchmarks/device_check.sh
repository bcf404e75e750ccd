#!/usr/bin/env bash
# The accelerator checks in one run (a GPU machine with JAX, pytest and hypothesis):
#   OUT=/some/dir bash benchmarks/device_check.sh [--quick]
# Each part has its own time limit and writes its own file under $OUT, so a part
# that runs long costs only itself:
#   device.txt      the device and the versions
#   bits_*.json     backend_bits.py digests on the accelerator and on the host CPU,
#   bits.txt        and the cases where they differ (none is the goal)
#   pytest.txt      the issue's test selection with JAX's default backend
#   accelerator.txt benchmarks/accelerator.py parts 3-5 (speed, quantized contractions,
#                   the bare GEMMs beneath them); hlo/ part 4's optimized programs
#   models.txt      GPT-2-small forward rows of benchmarks/models.py
#   explain.txt     benchmarks/explain.py --quick: predicted against measured time
# (benchmarks/backend_diff.py, run alone, says where two backends' bits differ.)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.
OUT=${OUT:?set OUT to a folder}
mkdir -p "$OUT"
quick=${1:-}
size=$([ "$quick" = --quick ] && echo 65536 || echo 1048576)
acc=$([ "$quick" = --quick ] && echo "--quick" || echo "")

{ nvidia-smi -L 2>/dev/null; python -c "import jax, jaxlib, ml_dtypes, numpy; \
print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'ml_dtypes', ml_dtypes.__version__, \
'numpy', numpy.__version__); print(jax.devices())"; } >"$OUT/device.txt" 2>&1

# Correctness first, all at once (the device is shared; nothing here is timed):
# the CI case list (every format and encoding; see backend_bits.cases) on 1M values,
accel=$(python -c "import jax; print(jax.devices()[0].platform)")
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 150 python tests/dtypes/backend_bits.py "$OUT/bits_$accel.json" --size "$size" \
    --device "$accel" --quick >"$OUT/bits_run.txt" 2>&1 &
JAX_PLATFORMS=cpu timeout 150 python tests/dtypes/backend_bits.py "$OUT/bits_cpu.json" \
    --size "$size" --device cpu --quick >>"$OUT/bits_run.txt" 2>&1 &
# and the issue's test selection with JAX's default backend (pytest-xdist workers where
# a .gpu_site folder brings it; -v, so a run cut short still says what passed; no
# pytest-benchmark, which refuses to run beside xdist)
plugin="-p _precision_pytestplugin"
python -c "import importlib.metadata as m, sys; \
sys.exit(any(e.name == 'precision' for e in m.entry_points(group='pytest11')))" || plugin=""
workers=""
[ -d .gpu_site ] && workers="-n 6 --dist loadfile"
PYTHONPATH=.:.gpu_site timeout 150 python -m pytest $plugin -o addopts="" \
    -p no:cacheprovider -p no:benchmark -v -ra --maxfail=60 $workers -W ignore::DeprecationWarning \
    tests/dtypes tests/precision/test_contract.py tests/precision/test_compute_rules.py \
    tests/precision/test_models.py >"$OUT/pytest.txt" 2>&1 &
wait
python tests/dtypes/backend_bits.py --compare "$OUT/bits_$accel.json" "$OUT/bits_cpu.json" \
    >"$OUT/bits.txt" 2>&1
unset XLA_PYTHON_CLIENT_PREALLOCATE

# then the timings, alone on the device: Tensor @ Tensor and encodes, the quantized
# contractions (their optimized programs under hlo/), the bare GEMMs beneath them,
timeout 80 python benchmarks/accelerator.py --parts 3 $acc >"$OUT/accelerator.txt" 2>&1
mkdir -p "$OUT/hlo"
timeout 90 python benchmarks/accelerator.py --parts 4 --hlo "$OUT/hlo" $acc \
    >>"$OUT/accelerator.txt" 2>&1
timeout 50 python benchmarks/accelerator.py --parts 5 $acc >>"$OUT/accelerator.txt" 2>&1
# GPT-2-small forward against plain JAX given the same weights (issue 20's two rows),
timeout 70 python benchmarks/models.py --model gpt2 --modes forward \
    --rows apply-bf16,int8/bf16 $acc >"$OUT/models.txt" 2>&1
# and explain's predicted time against the measured one (datasheet rates)
timeout 50 python benchmarks/explain.py --quick >"$OUT/explain.txt" 2>&1
tail -3 "$OUT/pytest.txt"
tail -3 "$OUT/bits.txt"
