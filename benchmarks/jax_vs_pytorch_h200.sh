#!/usr/bin/env bash
# One call on a CUDA machine for the JAX engine (issue 19): `benchmarks.jax_vs_pytorch_h200`
# (the JAX and PyTorch engines side by side on random:gemma-4-e2b, bf16), within $TMO
# seconds (default 540). Results go under $OUT (default ./out).
#
# Wheels the machine lacks are carried in $WHEELS (default ./.whl): jax_wheels.sh.
#
#   OUT=/path/to/out WHEELS=../.whl bash benchmarks/jax_vs_pytorch_h200.sh
set -uo pipefail
OUT="${OUT:-$PWD/out}"
WHEELS="${WHEELS:-.whl}"
mkdir -p "$OUT"
source "$(dirname "$0")/jax_wheels.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader
python3 -c "import jax, jaxlib, torch; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__)"
PYTHONUNBUFFERED=1 timeout "${TMO:-540}" python3 -m benchmarks.jax_vs_pytorch_h200 "$OUT/b" > "$OUT/bench.log" 2>&1
echo "benchmark exit: $?"
grep -v "^\s*$" "$OUT/bench.log" | tail -30
tail -5 "$OUT"/b/jax-server.log 2>/dev/null
rm -rf "$OUT"/b/*-sweep
