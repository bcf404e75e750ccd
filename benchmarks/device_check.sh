#!/usr/bin/env bash
# The accelerator checks in one run (a GPU machine with JAX, pytest and hypothesis):
#   OUT=/some/dir bash benchmarks/device_check.sh [--quick]
#   OUT=/some/dir PARTS="bits pytest acc4 acc5 profile" bash benchmarks/device_check.sh
# PARTS picks what runs (all of them by default, about 13 minutes in all; a machine that
# limits a command to 10 runs it as two). Each part has its own time limit and writes its
# own file under $OUT, so a part that runs long costs only itself:
#   device.txt        the device and the versions (always)
#   bits.txt          bits: backend_bits.py's cases where the accelerator and the host CPU
#                     differ (none is the goal); its digests stay in a temporary folder
#   pytest.txt        pytest: the issue's test selection with JAX's default backend, on
#                     pytest-xdist workers where xdist is installed (PYTEST_FILES overrides
#                     the selection)
#   accelerator.txt   acc3 acc4 acc5 acc6: benchmarks/accelerator.py's parts 3-6 (speed,
#                     quantized contractions, the bare GEMMs beneath them, encodes eager
#                     and jitted)
#   models.txt        models: GPT-2-small forward rows of benchmarks/models.py
#   explain.txt       explain: benchmarks/explain.py --quick, predicted against measured
#   profile.txt       profile: benchmarks/gpu_profile.py, the kernels of one call of each
#                     contraction and of GPT-2's forward
#   programs.tar.gz   the optimized programs of parts 4 and 6 and the raw profiles
# (eight files in all: a device machine that returns few files gets every one)
# bits and pytest run side by side first (nothing there is timed), then the timings alone.
# (benchmarks/backend_diff.py, run alone, says where two backends' bits differ.)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to a folder}
mkdir -p "$OUT"
quick=${1:-}
size=$([ "$quick" = --quick ] && echo 65536 || echo 1048576)
acc=$([ "$quick" = --quick ] && echo "--quick" || echo "")
parts=" ${PARTS:-bits pytest acc3 acc4 acc5 acc6 models explain profile} "
has() { [[ "$parts" == *" $1 "* ]]; }
keep=$(mktemp -d)
mkdir -p "$keep/hlo"

# JAX must start on the accelerator within a minute, or nothing else is worth the lease
# (a machine whose GPU hung once took the whole lease without a line of output)
{ timeout 20 nvidia-smi -L; timeout 60 python -c "import jax, jaxlib, ml_dtypes, numpy; \
print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'ml_dtypes', ml_dtypes.__version__, \
'numpy', numpy.__version__); print(jax.devices())"; } >"$OUT/device.txt" 2>&1 || {
    cat "$OUT/device.txt"; echo "JAX did not start on this machine; nothing else run"; exit 1; }

# Correctness first, side by side (nothing here is timed): the CI case list (every format
# and encoding; see backend_bits.cases) on 1M values on both backends,
export XLA_PYTHON_CLIENT_PREALLOCATE=false
accel=$(timeout 60 python -c "import jax; print(jax.devices()[0].platform)")
if has bits; then
    timeout 150 python tests/dtypes/backend_bits.py "$keep/$accel.json" --size "$size" \
        --device "$accel" --quick >"$keep/run_$accel.txt" 2>&1 &
    JAX_PLATFORMS=cpu timeout 150 python tests/dtypes/backend_bits.py "$keep/cpu.json" \
        --size "$size" --device cpu --quick >"$keep/run_cpu.txt" 2>&1 &
fi
# and the issue's test selection with JAX's default backend (-rfE: the failures named at
# the end; no pytest-benchmark, which refuses to run beside xdist)
if has pytest; then
    plugin="-p _precision_pytestplugin"
    python -c "import importlib.metadata as m, sys; \
sys.exit(any(e.name == 'precision' for e in m.entry_points(group='pytest11')))" || plugin=""
    workers=""
    PYTHONPATH=.:.gpu_site python -c "import xdist" 2>/dev/null && workers="-n 14 --dist loadfile"
    files=${PYTEST_FILES:-tests/dtypes tests/precision/test_contract.py \
tests/precision/test_compute_rules.py tests/precision/test_models.py tests/precision/test_gpu_programs.py}
    # shellcheck disable=SC2086
    PYTHONPATH=.:.gpu_site timeout "${PYTEST_SECONDS:-200}" python -m pytest $plugin \
        -o addopts="" -p no:cacheprovider -p no:benchmark -q -rfE --maxfail=60 $workers \
        -W ignore::DeprecationWarning $files >"$OUT/pytest.txt" 2>&1 &
fi
wait
if has bits; then
    { python tests/dtypes/backend_bits.py --compare "$keep/$accel.json" "$keep/cpu.json"
      tail -5 "$keep"/run_*.txt; } >"$OUT/bits.txt" 2>&1
    tail -3 "$OUT/bits.txt"
fi
has pytest && tail -3 "$OUT/pytest.txt"
unset XLA_PYTHON_CLIENT_PREALLOCATE

# then the timings, alone on the device: Tensor @ Tensor and encodes, the quantized
# contractions (their optimized programs kept), the bare GEMMs beneath them, the encodes
for part in 3 4 5 6; do
    has "acc$part" || continue
    limit=$(( part == 4 ? 120 : part == 5 ? 70 : 60 ))
    timeout $limit python benchmarks/accelerator.py --parts $part --hlo "$keep/hlo" $acc \
        >>"$OUT/accelerator.txt" 2>&1
done
# where the time of those contractions and of GPT-2's forward goes, kernel by kernel,
has profile && timeout 150 python benchmarks/gpu_profile.py --out "$keep" $acc \
    >"$OUT/profile.txt" 2>&1
# GPT-2-small forward against plain JAX given the same weights (issue 20's two rows),
has models && timeout 120 python benchmarks/models.py --model gpt2 --modes forward \
    --rows apply-bf16,int8/bf16 $acc >"$OUT/models.txt" 2>&1
# and explain's predicted time against the measured one (datasheet rates)
has explain && timeout 50 python benchmarks/explain.py --quick >"$OUT/explain.txt" 2>&1
tar -czf "$OUT/programs.tar.gz" -C "$keep" hlo $(cd "$keep" && ls profiles.tar.gz 2>/dev/null)
exit 0
