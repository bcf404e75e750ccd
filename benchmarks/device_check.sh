#!/usr/bin/env bash
# The accelerator checks in one run (a GPU machine with JAX, pytest and hypothesis):
#   OUT=/some/dir bash benchmarks/device_check.sh [--quick]
# The whole run takes up to 13 minutes; a device machine that limits a command to
# 10 runs it as two: WHAT=correctness (about 4 min) then WHAT=timings (up to 9).
# Each part has its own time limit and writes its own file under $OUT, so a part
# that runs long costs only itself:
#   device.txt      the device and the versions
#   bits.txt        backend_bits.py's cases where the accelerator and the host CPU
#                   differ (none is the goal); its digests stay in a temporary folder
#   pytest.txt      the issue's test selection with JAX's default backend
#   accelerator.txt benchmarks/accelerator.py parts 3-6 (speed, quantized contractions,
#                   the bare GEMMs beneath them, encodes eager and jitted); hlo/ the
#                   optimized programs of parts 4 and 6, one file each
# (eight files in all: a device machine that returns few files gets every one)
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

what=${WHAT:-all}
if [ "$what" != timings ]; then
# Correctness first, all at once (the device is shared; nothing here is timed):
# the CI case list (every format and encoding; see backend_bits.cases) on 1M values,
accel=$(python -c "import jax; print(jax.devices()[0].platform)")
export XLA_PYTHON_CLIENT_PREALLOCATE=false
digests=$(mktemp -d)
timeout 150 python tests/dtypes/backend_bits.py "$digests/$accel.json" --size "$size" \
    --device "$accel" --quick >"$digests/run_$accel.txt" 2>&1 &
JAX_PLATFORMS=cpu timeout 150 python tests/dtypes/backend_bits.py "$digests/cpu.json" \
    --size "$size" --device cpu --quick >"$digests/run_cpu.txt" 2>&1 &
# and the issue's test selection with JAX's default backend (pytest-xdist workers where
# a .gpu_site folder brings it; -q -rfE: the failures named at the end; no
# pytest-benchmark, which refuses to run beside xdist)
plugin="-p _precision_pytestplugin"
python -c "import importlib.metadata as m, sys; \
sys.exit(any(e.name == 'precision' for e in m.entry_points(group='pytest11')))" || plugin=""
workers=""
[ -d .gpu_site ] && workers="-n 14 --dist loadfile"
PYTHONPATH=.:.gpu_site timeout 220 python -m pytest $plugin -o addopts="" \
    -p no:cacheprovider -p no:benchmark -q -rfE --maxfail=60 $workers \
    -W ignore::DeprecationWarning \
    tests/dtypes tests/precision/test_contract.py tests/precision/test_compute_rules.py \
    tests/precision/test_models.py >"$OUT/pytest.txt" 2>&1 &
wait
{ python tests/dtypes/backend_bits.py --compare "$digests/$accel.json" "$digests/cpu.json"
  tail -5 "$digests"/run_*.txt; } >"$OUT/bits.txt" 2>&1
unset XLA_PYTHON_CLIENT_PREALLOCATE
tail -3 "$OUT/pytest.txt"
tail -3 "$OUT/bits.txt"
fi
if [ "$what" = correctness ]; then exit 0; fi

# then the timings, alone on the device: Tensor @ Tensor and encodes, the quantized
# contractions (their optimized programs under hlo/), the bare GEMMs beneath them,
timeout 80 python benchmarks/accelerator.py --parts 3 $acc >"$OUT/accelerator.txt" 2>&1
mkdir -p "$OUT/hlo"
timeout 150 python benchmarks/accelerator.py --parts 4 --hlo "$OUT/hlo" $acc \
    >>"$OUT/accelerator.txt" 2>&1
timeout 90 python benchmarks/accelerator.py --parts 5 $acc >>"$OUT/accelerator.txt" 2>&1
timeout 50 python benchmarks/accelerator.py --parts 6 --hlo "$OUT/hlo" $acc \
    >>"$OUT/accelerator.txt" 2>&1
# GPT-2-small forward against plain JAX given the same weights (issue 20's two rows),
timeout 120 python benchmarks/models.py --model gpt2 --modes forward \
    --rows apply-bf16,int8/bf16 $acc >"$OUT/models.txt" 2>&1
# and explain's predicted time against the measured one (datasheet rates)
timeout 50 python benchmarks/explain.py --quick >"$OUT/explain.txt" 2>&1
