#!/usr/bin/env bash
# One call on a CUDA machine for the JAX engine (issue 19): `benchmarks.jax_vs_pytorch_h200`
# (the JAX and PyTorch engines side by side on random:gemma-4-e2b, bf16), within a
# 7-minute limit. Results go under $OUT (default ./out).
#
# The machine has torch and JAX with CUDA but reaches no package index: wheels for what
# else the engines need (transformers, pydantic, starlette, uvicorn, httptools, orjson)
# are carried in $WHEELS (default ./.whl) and installed into /tmp/site first, if present.
#
#   OUT=/path/to/out WHEELS=../.whl bash benchmarks/jax_vs_pytorch_h200.sh
set -uo pipefail
OUT="${OUT:-$PWD/out}"
WHEELS="${WHEELS:-.whl}"
mkdir -p "$OUT"
wheels=()
for name in transformers pydantic pydantic_core annotated_types typing_inspection \
  typing_extensions starlette uvicorn orjson httptools; do
  for f in "$WHEELS"/"$name"-[0-9]*.whl; do [ -e "$f" ] && wheels+=("$f"); done
done
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}" > "$OUT/pip.log" 2>&1
  export PYTHONPATH="/tmp/site:$PWD"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader
python3 -c "import jax, jaxlib, torch; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__)"
PYTHONUNBUFFERED=1 timeout 420 python3 -m benchmarks.jax_vs_pytorch_h200 "$OUT/b" > "$OUT/bench.log" 2>&1
echo "benchmark exit: $?"
grep -v "^\s*$" "$OUT/bench.log" | tail -30
tail -5 "$OUT"/b/jax-server.log 2>/dev/null
rm -rf "$OUT"/b/*-sweep
