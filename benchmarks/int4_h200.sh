#!/usr/bin/env bash
# W4A16 against bf16 on a CUDA machine (issue 18), in two calls that fit a short lease:
#   steps:  the int4 kernels checked against dequantize-then-matmul on the GPU and timed
#           on E2B's projections beside cuBLAS and torch's tinygemm
#           (`benchmarks.int4_h200`), then the engine's model step (`engines.pytorch.
#           stepbench`, decode program, CUDA graphs, Triton kernels, uncompiled) at batch
#           1, 8 and 64 in bf16 and with --quantize w4a16, greedy tokens and a profile;
#   server: `benchmarks.pytorch_engine_h200`'s server sweep (the project's own sweep over
#           HTTP, 128 in / 512 out at 1, 8 and 64 requests, shipped server defaults) for
#           bf16 and for --quantize w4a16.
# Wheels for what the machine lacks are carried in ./.whl (see pytorch_engine_h200.sh).
#
#   OUT=/path/to/out bash benchmarks/int4_h200.sh steps|server
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > /dev/null 2>&1
  export PYTHONPATH="/tmp/site:$PWD"
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem,power.limit --format=csv,noheader
case "${1:-steps}" in
steps)
  timeout 200 python3 -m benchmarks.int4_h200 --out "$OUT/layers.json" > "$OUT/layers.log" 2>&1
  echo "layers exit: $?"; grep -v "^| [a-z]" "$OUT/layers.log" | tail -12
  for q in none w4a16; do
    timeout 150 python3 -m engines.pytorch.stepbench --model random:gemma-4-e2b \
      --batches 1,8,64 --decode-attention batched --cuda-graphs on --fused-norms on \
      --decode-program on --triton-gemv on --attention-form kernel --quantize "$q" \
      --check-tokens 24 --profile --out "$OUT/step-$q.json" > "$OUT/step-$q.log" 2>&1
    echo "step $q exit: $?"; tail -3 "$OUT/step-$q.log" | cut -c1-400
  done
  ;;
server)
  SKIP=generate,step_rowwise_eager,step_batched_eager,step_batched_graphs_unfused
  SKIP=$SKIP,step_batched_graphs,step_program_graphs,step_program_graphs_gemv
  timeout 560 python3 -m benchmarks.pytorch_engine_h200 "$OUT/eng" --skip "$SKIP" \
    --levels 1,8,64 --repeats 1 --budget-s 540 \
    --server-variant int4="--quantize w4a16" > "$OUT/bench.log" 2>&1
  echo "benchmark exit: $?"
  grep "^|\|ERROR" "$OUT/bench.log"
  rm -f "$OUT"/eng/sweep*/requests.jsonl "$OUT"/eng/sweep*/vllm_bench_serve.jsonl
  rm -f "$OUT"/eng/sweep*/summary.json
  ;;
esac
