#!/usr/bin/env bash
# The accelerator checks in one run (a GPU machine with JAX, pytest and hypothesis):
#   OUT=/some/dir bash benchmarks/device_check.sh [--quick]
# Each part has its own time limit and writes its own file under $OUT, so a part
# that runs long costs only itself:
#   device.txt      the device and the versions
#   bits_*.json     backend_bits.py digests on the accelerator and on the host CPU,
#   bits.txt        and the cases where they differ (none is the goal)
#   accelerator.txt benchmarks/accelerator.py sections 2-4 (dots, speed, quantized)
#   pytest.txt      the issue's test selection with JAX's default backend
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

# the CI case list (every format and encoding; see backend_bits.cases) on 1M values
accel=$(python -c "import jax; print(jax.devices()[0].platform)")
timeout 200 python tests/dtypes/backend_bits.py "$OUT/bits_$accel.json" --size "$size" \
    --device "$accel" --quick >"$OUT/bits_run.txt" 2>&1 &
JAX_PLATFORMS=cpu timeout 200 python tests/dtypes/backend_bits.py "$OUT/bits_cpu.json" \
    --size "$size" --device cpu --quick >>"$OUT/bits_run.txt" 2>&1 &
wait
python tests/dtypes/backend_bits.py --compare "$OUT/bits_$accel.json" "$OUT/bits_cpu.json" \
    >"$OUT/bits.txt" 2>&1

timeout 150 python benchmarks/accelerator.py --parts 24 $acc >"$OUT/accelerator.txt" 2>&1
timeout 150 python benchmarks/accelerator.py --parts 3 $acc >>"$OUT/accelerator.txt" 2>&1

# the plugin is an entry point where the project is installed, else named here
plugin="-p _precision_pytestplugin"
python -c "import importlib.metadata as m, sys; \
sys.exit(any(e.name == 'precision' for e in m.entry_points(group='pytest11')))" || plugin=""
timeout 170 python -m pytest $plugin -p no:cacheprovider -q --maxfail=40 \
    -W ignore::DeprecationWarning \
    tests/precision/test_contract.py tests/precision/test_int_contraction_scalings.py \
    tests/dtypes/test_asymmetric.py tests/dtypes/test_int_quantization.py \
    tests/dtypes/test_mx_nvfp4.py tests/dtypes/test_edge_regressions.py \
    tests/precision/test_compute_rules.py >"$OUT/pytest.txt" 2>&1
tail -3 "$OUT/pytest.txt"
cat "$OUT/bits.txt" | tail -3
