#!/usr/bin/env bash
# One call on a CUDA machine for the PyTorch engine (issue 4), in the order that makes the
# most of a short lease (at most 9 minutes, within a 10-minute call): the engine's CUDA
# tests, then `benchmarks.pytorch_engine_h200` with the shipped defaults, the model step
# with dependent launch off beside it, and the server profiling a window of its decode
# steps. Results go under $OUT (default ./out). Other step variants take about 30 s each:
# `--step-variant sweep="--steps 512"` (the sweep's context lengths), or
# `--step-variant kv1024="--prompt-len 600"`.
#
# The machine has torch and Triton but reaches no package index: wheels for what else
# the engine needs (transformers, pydantic, starlette, uvicorn, httptools, orjson,
# pytest...) are carried in ./.whl (`bash benchmarks/device_wheels.sh` downloads them)
# and installed into /tmp/site first, if present.
#
#   OUT=/path/to/out bash benchmarks/pytorch_engine_h200.sh
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > /dev/null 2>&1
  export PYTHONPATH="/tmp/site:$PWD"
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem,power.limit --format=csv,noheader

timeout 200 python3 -m pytest -q tests/engines/pytorch/test_kernels.py \
  tests/engines/pytorch/test_attention_kernel.py tests/engines/pytorch/test_dependent_launch.py \
  "tests/engines/pytorch/test_runner.py::test_a_queued_cuda_step_and_its_greedy_choice_never_wait_for_the_device" \
  > "$OUT/cuda-tests.log" 2>&1
echo "CUDA tests: $(tail -1 "$OUT/cuda-tests.log")"

STEP_MODES=step_rowwise_eager,step_batched_eager,step_batched_graphs_unfused,step_batched_graphs
STEP_MODES=$STEP_MODES,step_program_graphs,step_program_graphs_gemv
timeout 340 python3 -m benchmarks.pytorch_engine_h200 "$OUT/eng" --skip "$STEP_MODES" \
  --levels 1,8,64 --compile-batches 1 --budget-s 330 \
  --step-variant shipped="" \
  --step-variant nopdl="--dependent-launch off" \
  --server-args "--profile-dir $OUT/eng/profile" > "$OUT/bench.log" 2>&1
echo "benchmark exit: $?"
grep "^|" "$OUT/bench.log"
head -25 "$OUT/eng/profile/decode-profile.txt" 2>/dev/null
# Large, and not needed for the table (the device returns only so many files).
rm -f "$OUT"/eng/sweep*/requests.jsonl "$OUT"/eng/sweep*/vllm_bench_serve.jsonl
rm -f "$OUT"/eng/sweep*/summary.json "$OUT"/eng/profile/decode-trace.json
