#!/usr/bin/env bash
# One call on a CUDA machine for the JAX engine's batch-1 decode (issue 19), within
# $BUDGET seconds (default 480), each stage skipped when too little time is left:
# 1. `benchmarks.jax_step_h200` under each XLA variant of $VARIANTS (the first with a
#    profile): one step a call (synced, chained, the bare dispatch) against
#    `--decode-steps 8` in one call;
# 2. the server (`benchmarks.jax_vs_pytorch_h200 --engines jax`, our sweep at 1, 8, 64
#    requests of 128/512) under the variant whose multi-step decode was fastest;
# 3. if time is left, the step benchmark under each variant of $LAST_VARIANTS.
# $STEPS: the greedy steps per call timed (comma-separated); $JAX_FLAGS: the server's flags;
# $SERVER_VARIANT: the server's XLA variant (default: the fastest multi-step decode).
# Variants: default (XLA's own flags), exhaustive (XLA's exhaustive search over its Triton
# GEMM tilings at compile time), xla and pallas (XLA's defaults with the engine's decode
# attention as XLA's own kernels or as its Pallas kernel), graphs_while (command buffers, i.e. CUDA graphs,
# taking the device loop too), no_graphs (command buffers off), no_triton_gemm (cuBLAS
# for every GEMM).
# Results under $OUT: steps.json (every variant), b/result.json, logs and two traces.
#
#   OUT=/path/to/out WHEELS=../.whl bash benchmarks/jax_decode_h200.sh
# (MODEL=random:tiny-gemma4 for a dry run on a CPU)
set -uo pipefail
T0=$SECONDS
BUDGET="${BUDGET:-480}"
OUT="${OUT:-$PWD/out}"
WHEELS="${WHEELS:-.whl}"
VARIANTS="${VARIANTS-default graphs_while}"
LAST_VARIANTS="${LAST_VARIANTS-no_graphs}"
SERVER_S="${SERVER_S:-200}"  # kept for the server stage
MODEL="${MODEL:-random:gemma-4-e2b}"
STEPS="${STEPS:-8}"
JAX_FLAGS="${JAX_FLAGS:---max-model-len 1024 --prefill-buckets 128,512 --kv-buckets 1024 \
--batch-buckets 1,8 --decode-steps 8 --compile-threads 8}"
mkdir -p "$OUT"
left() { echo $((BUDGET - (SECONDS - T0))); }
source "$(dirname "$0")/jax_wheels.sh"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader \
  || echo "no nvidia-smi"
declare -A STEP_ARGS=([xla]="--decode-attention xla" [pallas]="--decode-attention pallas")
declare -A FLAGS=(
  [default]=""
  [exhaustive]="--xla_gpu_exhaustive_tiling_search=true"
  [xla]=""
  [pallas]=""
  [graphs_while]="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL --xla_gpu_graph_min_graph_size=1"
  [no_graphs]="--xla_gpu_enable_command_buffer="
  [no_triton_gemm]="--xla_gpu_enable_triton_gemm=false"
)
step() {  # step NAME LIMIT_S [ARGS...]
  local name=$1 limit=$2
  shift 2
  echo "== step $name (limit ${limit}s, $(left)s left)"
  XLA_FLAGS="${FLAGS[$name]}" timeout "$limit" python3 -m benchmarks.jax_step_h200 \
    "$OUT/step-$name.json" --model "$MODEL" --max-len 1024 --steps "$STEPS" ${STEP_ARGS[$name]:-} "$@" >> "$OUT/steps.log" 2>&1
  echo "step $name exit: $?"
}
profile=(--profile /tmp/prof)
for variant in $VARIANTS; do
  [ "$(left)" -gt $((SERVER_S + 40)) ] && step "$variant" 150 "${profile[@]}"
  profile=()
done
best=$(python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
done = {}
for p in Path(sys.argv[1]).glob("step-*.json"):
    r = json.loads(p.read_text())
    if "steps_ms_per_token" in r:
        done[p.stem.removeprefix("step-")] = r["steps_ms_per_token"]
print(min(done, key=done.get) if done else "default")
EOF
)
best="${SERVER_VARIANT:-$best}"
echo "== server under $best ($(left)s left)"
server_s=$(( $(left) - 15 ))
[ "$server_s" -gt $((SERVER_S + 40)) ] && server_s=$((SERVER_S + 40))
XLA_FLAGS="${FLAGS[$best]}" timeout "$server_s" python3 -m benchmarks.jax_vs_pytorch_h200 \
  "$OUT/b" --model "$MODEL" --engines jax --prefill-lens "${PREFILL_LENS:-128,512}" \
  --jax-flags "$JAX_FLAGS" > "$OUT/bench.log" 2>&1
echo "server exit: $? (XLA_FLAGS of $best)"
for variant in $LAST_VARIANTS; do
  [ "$(left)" -gt 60 ] && step "$variant" $(( $(left) - 25 ))
done
python3 - "$OUT" "$best" <<'EOF'
import json, shutil, sys
from pathlib import Path
out = Path(sys.argv[1])
merged = {"server_variant": sys.argv[2]}
for p in sorted(out.glob("step-*.json")):
    merged[p.stem.removeprefix("step-")] = json.loads(p.read_text())
    p.unlink()
(out / "steps.json").write_text(json.dumps(merged, indent=1))
for name in ("one_step_a_call", "steps_in_one_call"):
    traces = list(Path("/tmp/prof", name).rglob("perfetto_trace.json.gz"))
    if traces:
        newest = max(traces, key=lambda p: p.stat().st_mtime)
        shutil.copy(newest, out / f"trace-{name}.json.gz")
EOF
rm -rf "$OUT"/b/*-sweep
grep -v "^\s*$" "$OUT/bench.log" | tail -22
python3 - "$OUT/steps.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for name, r in d.items():
    if not isinstance(r, dict):
        continue
    keys = ("synced_ms", "chained_ms", "dispatch_ms", "steps_ms_per_token", "compile_s")
    print(name, {k: round(r[k], 3) for k in keys if k in r}, r.get("steps_ms_per_token_by_count"),
          r.get("ahead_ms_per_token"))
    for kind in ("one_step_a_call", "steps_in_one_call"):
        prof = r.get(f"profile_{kind}", {})
        print(" ", kind, {k: v for k, v in prof.items() if not k.startswith("top")})
        print("  gpu top", prof.get("top_gpu_us_per_step", [])[:6])
        print("  host top", prof.get("top_host_us_per_step", [])[:8])
EOF
echo "total $((SECONDS - T0))s"
