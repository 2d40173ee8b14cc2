#!/usr/bin/env bash
# W4A16 against bf16 on a CUDA machine (issue 18), in two calls that fit a short lease:
#   steps:  the int4 kernels checked against dequantize-then-matmul on the GPU and timed
#           on E2B's projections beside cuBLAS and torch's tinygemm
#           (`benchmarks.int4_h200`), then the engine's model step (`engines.pytorch.
#           stepbench`, decode program, CUDA graphs, Triton kernels, uncompiled) at batch
#           1, 8 and 64 in bf16 and with --quantize w4a16, greedy tokens and a profile;
#   server: `benchmarks.pytorch_engine_h200`'s server sweep (the project's own sweep over
#           HTTP, 128 in / 512 out at LEVELS requests (default 1,8,64), shipped server
#           defaults, within TMO seconds, default 560) for bf16 and for --quantize w4a16,
#           each server's greedy text first (does it repeat within the run? with GREEDY_REF,
#           an earlier run's result.json: is it the same as there?); with PATCH, with a
#           patch to the int4 path applied
#           (here and wherever a server runs, a server's error lines are printed). Each
#           cell is REPEATS measured passes (default 3; the table gives their median)
#           after a warm-up: one pass at 64 requests moved int4 against bf16 by 4% from
#           sweep to sweep (benchmarks/records/2026-12-07-h100-int4-server-run-time-gates.md),
#           and passes are cheap beside the servers' starts;
#   profile: the served step at REQUESTS concurrent requests (default 1), bf16 and
#           int4, profiled and split along its chain of kernels
#           (`benchmarks.decode_profile`; about 5 minutes, 6.5 at REQUESTS=64);
#   profile-tables: the int4 step profiled twice in one run, with the shipped table and
#           with TABLE (a pinned table kept elsewhere, e.g. `git show REV:engines/pytorch/
#           int4_configs.json > old.json`, carried as an untracked file), which separates
#           a retuning from the machine (about 5 minutes);
#   swap:   the served int4 step profiled twice, each on its own server: with the tree as
#           it is, then with SWAP_FROM (an untracked copy of an earlier version, e.g.
#           `git show REV:engines/pytorch/triton_kernels.py > .scratch/before.py`, carried)
#           copied over SWAP_TO; an A/B of a kernel change in one call (about 5 minutes);
#   patch:  an A/B of a change kept as a patch (PATCH, e.g. one beside a record): applied,
#           its CUDA tests (TESTS: a pytest -k expression over the engine's CUDA test files),
#           the served int4 step profiled, then the patch taken back out and the step
#           profiled again on its own server (about 6 minutes; the first side compiles
#           the patch's kernels);
#   rows-ab: the model step (`engines.pytorch.stepbench`, STEP_FLAGS) at 1, 8, 16, 32 and 64
#           rows: bf16, then int4 with `cuda_int4_rows`' table as it is, then int4 with
#           an empty table (matmul_int4 for every few-row product), each in its own
#           process (about 4 minutes);
#   prefill: one packed prefill of 8 and of 16 prompts (128 tokens) profiled, bf16 and
#           int4 (`engines.pytorch.stepbench --profile-prefill`): wall, device and host
#           time and the top host ops (about 3 minutes); with PATCH (as in patch), int4 again
#           with the patch applied, after its CUDA tests (about 5 minutes);
#   patch-steps: an A/B of small kernel changes kept as patches, without servers: the
#           model step (`engines.pytorch.stepbench`, STEP_FLAGS, int4) at BATCHES rows
#           (default 1) after prompts of PROMPT_LEN tokens (default 512, keys as a served
#           request's), on the tree, then with each patch of PATCHES (space-separated, each
#           applied alone and taken back out; A+B applies both), then on the tree again (the
#           machine's drift) and bf16 last, each in its own process (about a minute a side),
#           each side's 24 greedy tokens and their logits set against the first side's; with
#           TESTS, the engine's int4 and attention CUDA tests (-k TESTS) on the tree first
#           and on each patch before its step (about a minute each);
#   tokens-repeat: the model step's 24 greedy tokens (batch 1) in two processes each, for
#           QUANTS (default "w4a16 none") and each prompt length of PROMPT_LENS (default
#           "128 512"), with more stepbench flags from REPEAT_FLAGS: does a second process
#           give the same tokens, and where not, at which token did the logits first differ
#           to the bit (0: the prefill's) and how near a tie was it there? (about 30 s an
#           int4 process, 70 a bf16 one);
#   prefill-rows: E2B's projections at a prefill's 512 and 2,048 rows (`benchmarks.int4_h200
#           --batches 512,2048`): bf16 cuBLAS, the engine's int4 path (the weight made
#           dense, then cuBLAS) and `matmul_int4` over all the rows (about 3 minutes);
#   server-int4: the int4 sweep alone (about 3 minutes: the bf16 one is in
#           benchmarks/records/2026-12-02-h200-int4-server.json);
#   sweep:  the engine's CUDA tests, then `benchmarks.int4_gemv_sweep` (every block shape
#           of a wide grid on each projection shape, 1 and 8 rows) within SWEEP_S seconds
#           (default 200), then the projections benchmark at one row if BUDGET_S allows;
#   table:  the int4 CUDA tests, the dequantize kernel timed against torch's form, then
#           the sweep at ROWS (default 1,8,64) within SWEEP_S seconds (default 400),
#           with SWEEP_FLAGS (--focused: retune from the shipped table), writing each
#           shape's best into $OUT/int4_configs.json (the engine's pinned table, with its
#           other entries);
#   bound:  E2B's projections at 1 and 64 rows (`benchmarks.int4_h200`) with weights
#           streamed from DRAM, then with each shape's products all over one copy that
#           L2 serves (`--l2-resident`): a shape whose time does not drop is bound by
#           launch, latency or instructions, not DRAM (about 5 minutes);
#   chain:  what a kernel boundary costs: a chain of E2B's batch-1 int4 products as a
#           launch a product against launches whose programs wait on counters
#           (`benchmarks.stage_chain_h200`), for each tile in TILES (default "8,2048,4
#           16,512,4": block_n,block_k,warps; about 2 minutes);
#   attention: the attention kernels' CUDA tests, then the served int4 step profiled with
#           the q/k norms, rotary and KV write as compiled torch ops before the attention
#           kernel (`--attention-form kernel`) and inside it (the default,
#           `normed-kernel`; about 6 minutes);
#   planar: the planar int4 layout's kernels against the engine's and cuBLAS at 64 rows
#           and at one row, their block shapes searched within PLANAR_S seconds (default
#           360; `benchmarks.int4_planar_h200`);
#   ncu:    Nsight Compute on the int4 product and cuBLAS's at each "N K ROWS" of SHAPES
#           (";"-separated; default down double and gate/up double at 64 rows; "N K ROWS
#           --cuda-config NAME" profiles `cuda_int4_rows`' build NAME instead of the
#           engine's choice): throughputs, warp stalls, registers, occupancy and the
#           tensor pipe (`benchmarks.int4_ncu_probe`; about 20 s a shape);
#   ple-pair: E2B's per-layer gate and projection, 35 layers chained in a CUDA graph, as the
#           engine's two launches a layer against one fused launch at a few block shapes
#           (`benchmarks.ple_pair_h200`; about 1 minute);
#   memory: `--quantize w4a16`'s memory: `benchmarks.int4_quantize_memory` (E2B's per-layer
#           table quantized by rows against in one pass), then the model step benchmark's
#           peaks at load and over the steps, bf16 and int4, at 1 and 64 rows (about 3
#           minutes);
#   forms:  every fused form of the batch-1 int4 product against `gemv_int4`, at each split
#           of `cuda_int4`'s CUDA build (`benchmarks.int4_cuda_forms_h200`; about 1 minute);
#   gemm:   `cuda_int4_rows`' product of a few rows (`benchmarks.int4_cuda_gemm_h200`: the
#           tensor-core CUDA scheme with X in shared memory) against matmul_int4 and cuBLAS
#           at ROWS (default 8,16,32,64), from cubins in GEMM_CUBINS (default
#           .scratch/gemm-cubins, built here by its --build and carried), else compiled
#           there by NVRTC; writes the engine's table of served builds into the tree and
#           $OUT (`cuda_int4_rows.TABLE`), then runs the CUDA tests of the few-row products
#           (about 2 minutes a row count from 32 rows on, 1 below; TMO bounds the search);
#   all:    both in one call, within BUDGET_S seconds (default 540): each stage gets what
#           is left, the server last, then a second int4 greedy run (tokens repeat?) and,
#           with CUDA_TESTS=1, the engine's CUDA tests if time is left (SKIP_LAYERS=1:
#           no projections benchmark); the autotuner's choices carry over through
#           Triton's disk cache.
# INT4_FLAGS: more engine flags for the int4 side of server and profile (for example
# "--attention-form kernel").
# Wheels for what the machine lacks are carried in ./.whl (`benchmarks/device_wheels.sh`);
# the CUDA tests also need gguf's (tests/conftest.py imports it; the image has none).
# A device call brings back at most 8 files from $OUT, none more than 2 folders down: where
# more were written, or deeper, all of $OUT goes into one tarball, $OUT/all.tgz, on exit.
#
#   OUT=/path/to/out bash benchmarks/int4_h200.sh \
#     steps|server|server-int4|patch-steps|tokens-repeat|prefill-rows|profile|profile-tables|swap|patch|forms|gemm|rows-ab|prefill|sweep|table|bound|chain|attention|planar|ncu|all
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
pack_out() {
  if [ "$(find "$OUT" -type f | wc -l)" -le 8 ] && ! find "$OUT" -mindepth 4 -type f | grep -q .
  then return; fi
  local packed
  packed=$(mktemp --suffix .tgz) && tar czf "$packed" -C "$OUT" . &&
    find "$OUT" -mindepth 1 -delete && mv "$packed" "$OUT/all.tgz"
}
trap pack_out EXIT
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > /dev/null 2>&1
  export PYTHONPATH="/tmp/site:$PWD"
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem,power.limit --format=csv,noheader
STEP_FLAGS="--model random:gemma-4-e2b --decode-attention batched --cuda-graphs on \
  --fused-norms on --decode-program on --triton-gemv on"
left() { echo $(( ${BUDGET_S:-540} - SECONDS )); }
# The engine's CUDA test files, named once. Each mode picks from them with a pytest -k
# expression ($3: a file's name, e.g. test_kernels.py, selects its tests), within $1
# seconds, logging to $OUT/$2, and says how they ended.
CUDA_TEST_FILES=(kernels attention_kernel dependent_launch int4_cuda cuda_int4 cuda_int4_rows
  kv_cache)
# The compiled kernels' own tests (norms, attention, dependent launch), as sweep and all run them.
KERNEL_TESTS="test_kernels.py or test_attention_kernel.py or test_dependent_launch.py"
cuda_tests() {
  local files=() name
  for name in "${CUDA_TEST_FILES[@]}"; do files+=("tests/engines/pytorch/test_$name.py"); done
  timeout "$1" python3 -m pytest -q -p no:cacheprovider "${files[@]}" -k "$3" > "$OUT/$2" 2>&1
  echo "CUDA tests: $(tail -1 "$OUT/$2") at ${SECONDS}s"
}
# The model step benchmark in bf16, then int4 ($1 names its files; then more stepbench
# flags), and a line each: step times (each waited / queued), greedy tokens, memory in GB.
step_pair() {
  local name=$1; shift
  for q in none w4a16; do
    # shellcheck disable=SC2086
    timeout 100 python3 -m engines.pytorch.stepbench $STEP_FLAGS --quantize "$q" "$@" \
      --out "$OUT/$name-$q.json" > "$OUT/$name-$q.log" 2>&1
    echo "$name $q exit: $? at ${SECONDS}s"
  done
  step_lines "$OUT/$name" none w4a16
}
# A line for each side of the model step benchmark ($1-SIDE.json for each SIDE after $1):
# step times (each waited / queued), greedy tokens, memory in GB.
step_lines() {
  python3 - "$@" <<'PY'
import json, sys
first = None
for side in sys.argv[2:]:
    try:
        d = json.load(open(f"{sys.argv[1]}-{side}.json"))
    except (OSError, ValueError) as e:
        print(side, "no result:", e)
        continue
    tokens = d.get("greedy_tokens_batch1")
    digests, gaps = d.get("greedy_logits_sha256_batch1"), d.get("greedy_top_gap_batch1")
    said = tokens
    if tokens is not None and first is not None:
        said = f"same as {sys.argv[2]}'s: {tokens == first[0]}"
        if digests and first[1]:
            # The first token whose logits differ to the bit, and how near a tie it was.
            parted = next((i for i, (a, b) in enumerate(zip(digests, first[1])) if a != b), None)
            said += (", logits equal to the bit" if parted is None else
                     f", logits first differ at token {parted} (top gap {first[2][parted]:.3g})")
    if "greedy_in_process_first_differ" in d:
        at = d["greedy_in_process_first_differ"]
        third = d.get("greedy_in_process_third_first_differ")
        said = f"{said}; again in the process: " + ("logits equal to the bit" if at is None else
                f"logits differ from token {at}") + "; third against second: " + (
                "equal to the bit" if third is None else f"differ from token {third}")
        if d.get("counters_left_nonzero"):
            said = f"{said}; {d['counters_left_nonzero']} launch counters left non-zero"
    if first is not None and d.get("gemv_configs") is not None:
        # The autotuner's picks (pinned shapes aside) can differ by process, hence the sums.
        other = [k for k in set(d["gemv_configs"]) | set(first[3])
                 if d["gemv_configs"].get(k) != first[3].get(k)]
        said = f"{said}; autotuned picks unlike {sys.argv[2]}'s: {sorted(other) or 'none'}"
    print(side, "step ms (each waited / queued):", [(r["batch"], round(r["decode_step_ms_median"], 3),
          round(r.get("decode_step_ms_queued", float("nan")), 3)) for r in d["decode"]],
          "tokens", said, "GB", {k: round(v / 1e9, 2) for k, v in d.items() if "bytes" in k and v})
    if first is None and tokens is not None:
        first = (tokens, digests, gaps, d.get("gemv_configs") or {})
PY
}
# Why a server under $1 did not serve: the error lines of each of its logs (a failed start
# shows only as a missing row in the benchmark's table).
server_errors() {
  local log
  for log in "$1"/server*.log "$1"/*-server.log; do
    [ -f "$log" ] || continue
    grep -iH "unsupported\|error" "$log" | head -5 | sed "s|^$OUT/||"
  done
}
# The served step profiled (`benchmarks.decode_profile`, 16 steps): $1 names its folder and
# log under $OUT, $2 is its time limit, the rest are its flags (--variant, --requests).
profile_run() {
  local name="$1" limit="$2"
  shift 2
  timeout "$limit" python3 -m benchmarks.decode_profile "$OUT/$name" --steps 16 "$@" \
    > "$OUT/$name.log" 2>&1
  echo "decode profile $name exit: $? at ${SECONDS}s"
  tail -8 "$OUT/$name.log"
  # whose pinned table each server ran (or that the autotuner chose), from its log
  grep -H "int4: " "$OUT/$name"/*-server.log 2>/dev/null | sed "s|^$OUT/||"
  server_errors "$OUT/$name"
}
case "${1:-steps}" in
sweep)
  cuda_tests 100 cuda-tests.log "$KERNEL_TESTS"
  timeout $(( ${SWEEP_S:-200} + 30 )) python3 -m benchmarks.int4_gemv_sweep --rows 1,8 \
    --budget-s "${SWEEP_S:-200}" --out "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1
  echo "sweep exit: $? at ${SECONDS}s"; grep "^rows\|^\[" "$OUT/sweep.log"
  if [ "$(left)" -gt 60 ]; then
    timeout $(( $(left) - 10 )) python3 -m benchmarks.int4_h200 --batches 1 \
      --out "$OUT/layers.json" > "$OUT/layers.log" 2>&1
    echo "layers exit: $? at ${SECONDS}s"; grep -v "^| [a-z]" "$OUT/layers.log" | tail -8
  fi
  ;;
table)
  cuda_tests 120 cuda-tests.log test_int4_cuda.py
  timeout 60 python3 -m benchmarks.int4_h200 --dequantize > "$OUT/dequantize.log" 2>&1
  echo "dequantize exit: $?"; cat "$OUT/dequantize.log" | tail -5
  cp engines/pytorch/int4_configs.json "$OUT/int4_configs.json" 2>/dev/null
  # shellcheck disable=SC2086
  timeout $(( ${SWEEP_S:-400} + 40 )) python3 -m benchmarks.int4_gemv_sweep \
    --rows "${ROWS:-1,8,64}" --budget-s "${SWEEP_S:-400}" --out "$OUT/sweep.json" \
    --table "$OUT/int4_configs.json" ${SWEEP_FLAGS:-} > "$OUT/sweep.log" 2>&1
  echo "sweep exit: $? at ${SECONDS}s"; grep "^rows\|^\[" "$OUT/sweep.log"
  ;;
bound)
  for mode in streamed l2-resident; do
    flag=""; [ "$mode" = l2-resident ] && flag="--l2-resident"
    # shellcheck disable=SC2086
    timeout 200 python3 -m benchmarks.int4_h200 --batches 1,64 $flag \
      --out "$OUT/layers-$mode.json" > "$OUT/layers-$mode.log" 2>&1
    echo "layers $mode exit: $? at ${SECONDS}s"; grep -v "^| [a-z]" "$OUT/layers-$mode.log" | tail -6
  done
  python3 - "$OUT" <<'PY'
import json, sys
runs = {m: json.load(open(f"{sys.argv[1]}/layers-{m}.json")) for m in ("streamed", "l2-resident")}
print("| projection | rows | ours us streamed / L2 | bf16 us streamed / L2 |")
print("| --- | --- | --- | --- |")
for a, b in zip(runs["streamed"]["shapes"], runs["l2-resident"]["shapes"]):
    cell = lambda i: f"{a.get(i + '_us', float('nan')):.1f} / {b.get(i + '_us', float('nan')):.1f}"
    print(f"| {a['name']} | {a['rows']} | {cell('int4_ours')} | {cell('bf16_cublas')} |")
PY
  ;;
chain)
  for tile in ${TILES:-8,2048,4 16,512,4}; do
    IFS=, read -r bn bk w <<< "$tile"
    timeout 240 python3 -m benchmarks.stage_chain_h200 --block-n "$bn" --block-k "$bk" \
      --warps "$w" --out "$OUT/chain-$bn-$bk-$w.json" > "$OUT/chain-$bn-$bk-$w.log" 2>&1
    echo "chain $tile exit: $? at ${SECONDS}s"; tail -8 "$OUT/chain-$bn-$bk-$w.log"
  done
  ;;
all)
  if [ -z "${SKIP_LAYERS:-}" ]; then
    timeout 150 python3 -m benchmarks.int4_h200 --out "$OUT/layers.json" > "$OUT/layers.log" 2>&1
    echo "layers exit: $? at ${SECONDS}s"; grep -v "^| [a-z]" "$OUT/layers.log" | tail -14
  fi
  step_pair step --batches 1,8,64 --check-tokens 24 --profile
  SKIP=generate,step_rowwise_eager,step_batched_eager,step_batched_graphs_unfused
  SKIP=$SKIP,step_batched_graphs,step_program_graphs,step_program_graphs_gemv
  SERVER_S=$(( $(left) - 40 ))
  if [ "$SERVER_S" -gt 90 ]; then
    timeout "$SERVER_S" python3 -m benchmarks.pytorch_engine_h200 "$OUT/eng" --skip "$SKIP" \
      --levels 1,8,64 --repeats ${REPEATS:-3} --budget-s $(( SERVER_S - 20 )) \
      --server-variant int4="--quantize w4a16" > "$OUT/bench.log" 2>&1
    echo "server exit: $? at ${SECONDS}s"
    grep "^|\|ERROR" "$OUT/bench.log" | tail -30
  else
    echo "server skipped: ${SERVER_S}s left"
  fi
  rm -rf "$OUT"/eng/sweep*
  if [ "$(left)" -gt 35 ]; then
    # shellcheck disable=SC2086
    timeout $(( $(left) - 5 )) python3 -m engines.pytorch.stepbench $STEP_FLAGS --batches 1 \
      --steps 4 --warmup 1 --quantize w4a16 --check-tokens 24 --out "$OUT/step-w4a16-again.json" \
      > "$OUT/step-again.log" 2>&1
    echo "second int4 greedy run exit: $? at ${SECONDS}s"
    step_lines "$OUT/step" w4a16 w4a16-again
  fi
  if [ -n "${CUDA_TESTS:-}" ] && [ "$(left)" -gt 45 ]; then
    cuda_tests $(( $(left) - 5 )) cuda-tests.log "$KERNEL_TESTS"
  fi
  ;;
steps)
  timeout 200 python3 -m benchmarks.int4_h200 --out "$OUT/layers.json" > "$OUT/layers.log" 2>&1
  echo "layers exit: $?"; grep -v "^| [a-z]" "$OUT/layers.log" | tail -12
  for q in none w4a16; do
    timeout 150 python3 -m engines.pytorch.stepbench --model random:gemma-4-e2b \
      --batches 1,8,64 --decode-attention batched --cuda-graphs on --fused-norms on \
      --decode-program on --triton-gemv on --quantize "$q" \
      --check-tokens 24 --profile --out "$OUT/step-$q.json" > "$OUT/step-$q.log" 2>&1
    echo "step $q exit: $?"; tail -3 "$OUT/step-$q.log" | cut -c1-400
  done
  ;;
tokens-repeat)
  # Does the model step give the same greedy tokens in a second process? For each
  # quantization of QUANTS and each prompt length of PROMPT_LENS, two processes' 24 tokens.
  for q in ${QUANTS:-w4a16 none}; do
    for len in ${PROMPT_LENS:-128 512}; do
      for run in 1 2; do
        # shellcheck disable=SC2086
        timeout 120 python3 -m engines.pytorch.stepbench $STEP_FLAGS ${REPEAT_FLAGS:-} \
          --batches 1 --steps 4 --warmup 1 --prompt-len "$len" --quantize "$q" --check-tokens 24 \
          --out "$OUT/repeat-$q-$len-$run.json" > "$OUT/repeat-$q-$len-$run.log" 2>&1
        echo "$q prompt $len run $run exit: $? at ${SECONDS}s"
      done
      step_lines "$OUT/repeat-$q-$len" 1 2
    done
  done
  ;;
profile)
  profile_run dp "${TMO:-560}" --requests "${REQUESTS:-1}" --variant bf16= \
    --variant int4="--quantize w4a16 ${INT4_FLAGS:-}"
  ;;
attention)
  cuda_tests 150 cuda-tests.log test_attention_kernel.py
  profile_run dp "${TMO:-420}" \
    --variant kernel="--quantize w4a16 --attention-form kernel ${INT4_FLAGS:-}" \
    --variant normed="--quantize w4a16 ${INT4_FLAGS:-}"
  ;;
planar)
  timeout $(( ${PLANAR_S:-360} + 90 )) python3 -m benchmarks.int4_planar_h200 \
    --budget-s "${PLANAR_S:-360}" --out "$OUT/planar.json" > "$OUT/planar.log" 2>&1
  echo "planar exit: $? at ${SECONDS}s"
  tail -15 "$OUT/planar.log"
  ;;
ncu)
  # Nsight Compute on each "N K ROWS [--cuda-config NAME]" of SHAPES (default: down double
  # and gate/up double at 64 rows): the int4 product (`cuda_int4_rows`' build NAME where
  # given) and cuBLAS's main kernel, once each after the warm-up
  # (`benchmarks.int4_ncu_probe`), with the sections that say what bounds them
  # (throughputs, warp stalls, occupancy); the full reports in $OUT (about 20 s a shape).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  IFS=';' read -ra shapes <<< "${SHAPES:-1536 12288 64;24576 1536 64}"
  for shape in "${shapes[@]}"; do
    name=$(echo "$shape" | sed 's/ --cuda-config / /' | tr ' ' '-')
    # shellcheck disable=SC2086
    timeout 120 "$NCU" --clock-control none --launch-skip 6 --launch-count 2 \
      --kernel-name regex:"matmul_int4|gemv|nvjet|gemm" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section Occupancy --section LaunchStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" \
      python3 -m benchmarks.int4_ncu_probe $shape > "$OUT/ncu-$name.txt" 2>&1
    echo "ncu $shape exit: $? at ${SECONDS}s"
    grep -E "^  [a-zA-Z_]|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\)|Registers Per|Achieved Active|Issued Warp|Shared Memory|stalled|hmma" \
      "$OUT/ncu-$name.txt"
  done
  ;;
profile-tables)
  profile_run dp "${TMO:-560}" --variant shipped="--quantize w4a16" \
    --variant table="--quantize w4a16 --int4-configs ${TABLE:?TABLE=path of the other table}"
  ;;
swap)
  : "${SWAP_FROM:?SWAP_FROM=the earlier file}" "${SWAP_TO:?SWAP_TO=the file it replaces}"
  for side in shipped swapped; do
    if [ "$side" = swapped ]; then cp "$SWAP_TO" /tmp/swap-shipped && cp "$SWAP_FROM" "$SWAP_TO"; fi
    profile_run "dp-$side" "${TMO:-270}" --requests "${REQUESTS:-1}" \
      --variant "$side=--quantize w4a16 ${INT4_FLAGS:-}"
  done
  cp /tmp/swap-shipped "$SWAP_TO"
  ;;
patch)
  : "${PATCH:?PATCH=the patch file}"
  git apply "$PATCH" || exit 1
  if [ -n "${TESTS:-}" ]; then
    cuda_tests 150 patch-tests.log \
      "(test_kernels.py or test_int4_cuda.py or test_cuda_int4.py) and ($TESTS)"
  fi
  profile_run dp-patched "${TMO:-240}" --requests "${REQUESTS:-1}" \
    --variant "patched=--quantize w4a16 ${INT4_FLAGS:-}"
  git apply -R "$PATCH"
  profile_run dp-shipped "${TMO:-200}" --requests "${REQUESTS:-1}" \
    --variant "shipped=--quantize w4a16 ${INT4_FLAGS:-}"
  ;;
forms)
  timeout "${TMO:-200}" python3 -m benchmarks.int4_cuda_forms_h200 --out "$OUT/forms.json" \
    > "$OUT/forms.log" 2>&1
  echo "forms exit: $? at ${SECONDS}s"
  tail -19 "$OUT/forms.log"
  ;;
gemm)
  CUBINS="${GEMM_CUBINS:-.scratch/gemm-cubins}"
  FROM=()
  [ -d "$CUBINS" ] && FROM=(--cubins "$CUBINS")
  timeout "${TMO:-400}" python3 -m benchmarks.int4_cuda_gemm_h200 "${FROM[@]}" \
    --rows "${ROWS:-8,16,32,64}" --out "$OUT/gemm.json" \
    --table engines/pytorch/int4_rows_configs.json > "$OUT/gemm.log" 2>&1
  echo "gemm probe exit: $? at ${SECONDS}s"
  grep -v "^[a-z].* {" "$OUT/gemm.log" | tail -70
  cp engines/pytorch/int4_rows_configs.json "$OUT/"
  cuda_tests 200 cuda-tests.log "test_cuda_int4_rows.py or test_int4_cuda.py"
  ;;
rows-ab)
  TABLE=engines/pytorch/int4_rows_configs.json
  cp "$TABLE" /tmp/rows-table.json
  for side in bf16 table empty; do
    q=w4a16
    [ "$side" = bf16 ] && q=none
    [ "$side" = empty ] && echo '{"measured_on": "", "builds": {}}' > "$TABLE"
    # shellcheck disable=SC2086
    timeout 150 python3 -m engines.pytorch.stepbench $STEP_FLAGS --quantize "$q" \
      --batches 1,8,16,32,64 --out "$OUT/rows-$side.json" > "$OUT/rows-$side.log" 2>&1
    echo "step $side exit: $? at ${SECONDS}s"
  done
  cp /tmp/rows-table.json "$TABLE"
  step_lines "$OUT/rows" bf16 table empty
  ;;
prefill)
  # With PATCH (as in patch), int4 once more with the patch applied, after its CUDA tests
  # (TESTS: a pytest -k expression over test_int4_cuda.py and test_kernels.py).
  sides="none w4a16"
  [ -n "${PATCH:-}" ] && sides="$sides patched"
  for side in $sides; do
    q=$side
    if [ "$side" = patched ]; then
      q=w4a16; git apply "$PATCH" || break
      cuda_tests 150 patch-tests.log \
        "(test_int4_cuda.py or test_kernels.py) and (${TESTS:-int4})"
    fi
    for n in 8 16; do
      # shellcheck disable=SC2086
      timeout 120 python3 -m engines.pytorch.stepbench $STEP_FLAGS --batches 1 --steps 4 \
        --warmup 1 --quantize "$q" --profile-prefill "$n" --out "$OUT/prefill-$side-$n.json" \
        > "$OUT/prefill-$side-$n.log" 2>&1
      echo "prefill $side $n exit: $?"
    done
    [ "$side" = patched ] && git apply -R "$PATCH"
  done
  python3 - "$OUT" <<'PY'
import json, sys
for side in ("none", "w4a16", "patched"):
    for n in (8, 16):
        try:
            p = json.load(open(f"{sys.argv[1]}/prefill-{side}-{n}.json"))["prefill_profile"]
        except (OSError, KeyError):
            continue
        print(f"{side} {n} prompts: wall {p['wall_ms']:.1f} ms, device {p['device_time_ms']:.1f},"
              f" host {p['host_self_cpu_ms']:.1f}, device busy {p.get('device_busy_fraction') or 0:.2f};",
              [(o["op"][:40], o["count"], round(o["self_cpu_ms"], 1)) for o in p["top_host_ops"][:6]])
        print("  top kernels:", [(k["kernel"][:48], k["count"], round(k["ms"], 2))
                                 for k in p["top_kernels"][:6]])
PY
  ;;
patch-steps)
  : "${PATCHES:?PATCHES=the patch files}"
  # With TESTS, the int4 and attention CUDA tests (-k TESTS) of the code a side runs.
  side_tests() {
    [ -z "${TESTS:-}" ] && return
    cuda_tests 240 "cuda-tests-$1.log" "(test_cuda_int4.py or test_cuda_int4_rows.py or \
      test_int4_cuda.py or test_attention_kernel.py) and ($TESTS)"
  }
  side_tests tree
  names=()
  # The model step as SIDE ($1) with --quantize $2, in its own process.
  step_side() {
    # shellcheck disable=SC2086
    timeout 150 python3 -m engines.pytorch.stepbench $STEP_FLAGS --batches "${BATCHES:-1}" \
      --prompt-len "${PROMPT_LEN:-512}" --steps 64 --quantize "$2" --check-tokens 24 \
      --out "$OUT/steps-$1.json" > "$OUT/steps-$1.log" 2>&1
    echo "$1 exit: $? at ${SECONDS}s"
    names+=("$1")
  }
  step_side tree w4a16
  n=0
  for patch in $PATCHES; do
    # A missing or stale patch is named and skipped, never measured as the tree.
    IFS=+ read -ra parts <<< "$patch"
    applied=()
    for part in "${parts[@]}"; do
      [ -f "$part" ] && git apply "$part" || break
      applied=("$part" "${applied[@]}")
    done
    if [ "${#applied[@]}" -eq "${#parts[@]}" ]; then
      echo "patch$n is $patch"
      side_tests "patch$n"
      step_side "patch$n" w4a16
    else
      echo "patch$n: $patch is not a patch that applies here; skipped"
    fi
    for part in "${applied[@]}"; do git apply -R "$part"; done
    n=$((n + 1))
  done
  step_side tree-again w4a16
  step_side bf16 none
  step_lines "$OUT/steps" "${names[@]}"
  ;;
prefill-rows)
  timeout "${TMO:-300}" python3 -m benchmarks.int4_h200 --batches "${ROWS:-512,2048}" \
    --out "$OUT/prefill-rows.json" > "$OUT/prefill-rows.log" 2>&1
  echo "prefill rows exit: $? at ${SECONDS}s"; grep -v "^| [a-z]" "$OUT/prefill-rows.log" | tail -8
  ;;
server-int4)
  SKIP=generate,step_rowwise_eager,step_batched_eager,step_batched_graphs_unfused
  SKIP=$SKIP,step_batched_graphs,step_program_graphs,step_program_graphs_gemv
  timeout ${TMO:-560} python3 -m benchmarks.pytorch_engine_h200 "$OUT/eng" --skip "$SKIP" \
    --levels 1,8,64 --repeats ${REPEATS:-3} --budget-s ${BUDGET_S:-540} --server-args "--quantize w4a16" \
    > "$OUT/bench.log" 2>&1
  echo "benchmark exit: $?"
  grep "^|\|ERROR" "$OUT/bench.log"
  server_errors "$OUT/eng"
  rm -rf "$OUT"/eng/sweep*
  ;;
ple-pair)
  timeout 240 python3 -m benchmarks.ple_pair_h200 --out "$OUT/ple_pair.json" \
    > "$OUT/ple_pair.log" 2>&1
  echo "ple pair exit: $? at ${SECONDS}s"; tail -12 "$OUT/ple_pair.log"
  ;;
memory)
  timeout 240 python3 -m benchmarks.int4_quantize_memory > "$OUT/quantize-memory.log" 2>&1
  echo "quantize memory exit: $? at ${SECONDS}s"; cat "$OUT/quantize-memory.log"
  step_pair memory --batches 1,64 --steps 4
  ;;
server)
  # With PATCH (as in patch), the sweep runs with the patch applied (a change to the int4
  # path leaves the bf16 side as it was), and it is taken back out after.
  if [ -n "${PATCH:-}" ]; then git apply "$PATCH" || exit 1; fi
  SKIP=generate,step_rowwise_eager,step_batched_eager,step_batched_graphs_unfused
  SKIP=$SKIP,step_batched_graphs,step_program_graphs,step_program_graphs_gemv
  timeout ${TMO:-560} python3 -m benchmarks.pytorch_engine_h200 "$OUT/eng" --skip "$SKIP" \
    --levels "${LEVELS:-1,8,64}" --repeats ${REPEATS:-3} --budget-s $(( ${TMO:-560} - 20 )) \
    --server-variant int4="--quantize w4a16 ${INT4_FLAGS:-}" \
    ${GREEDY_REF:+--greedy-reference "$GREEDY_REF"} > "$OUT/bench.log" 2>&1
  echo "benchmark exit: $?"
  if [ -n "${PATCH:-}" ]; then git apply -R "$PATCH"; fi
  grep "^|\|ERROR" "$OUT/bench.log"
  server_errors "$OUT/eng"
  rm -f "$OUT"/eng/sweep*/requests.jsonl "$OUT"/eng/sweep*/vllm_bench_serve.jsonl \
    "$OUT"/eng/probe*/requests.jsonl
  rm -f "$OUT"/eng/sweep*/summary.json
  ;;
esac
