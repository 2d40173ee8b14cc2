"""Run AIPerf and guidellm against an OpenAI-compatible server and read back what they report.

The client-capacity benchmark (issue 2, "Benchmark") prints our load generator's figures beside
those of two popular clients driven the same way: chat completions, streaming, a closed loop
holding ``concurrency`` requests in flight, every reply forced to exactly ``output_tokens``,
no warm-up, the tool pinned to one CPU and its CPU time measured. This module does the
driving and the reading; it imports nothing from either tool.

Each tool lives in its own virtualenv under
``${BENCH_CACHE_DIR:-~/.cache/llm-serving-bench}/tools/<name>-<version>/`` because both pull
heavy, mutually conflicting dependency trees (torch, transformers, pandas, zmq...) that must
never reach the project's own venv. `ensure_tool` creates it on first use (about 1.5 min each
on a 2-core machine) and reuses it afterwards.

Offline operation: neither tool can reach the Hugging Face hub here, and both need a
tokenizer to build prompts of a given token length. `ensure_tokenizer` writes a local
tokenizer folder (one token per UTF-8 byte, ids 0..255 == byte values; the same rule as
refserver/'s ``/tokenize``) that both load with plain
``AutoTokenizer.from_pretrained(<folder>)``. Quirks found on the way (details on
`run_aiperf` and `run_guidellm`):

- AIPerf 0.13 refuses a local tokenizer folder when ``HF_HUB_OFFLINE`` or
  ``TRANSFORMERS_OFFLINE`` is set (it then looks the name up in the hub cache only), and its
  ``--tokenizer builtin`` needs tiktoken's o200k file from the network; so AIPerf runs with
  both variables removed and the local folder, which never touches the network.
- guidellm 0.8.1 loads the folder fine with ``HF_HUB_OFFLINE=1``, which we set.

Usage::

    from benchmarks.thirdparty import run_aiperf, run_guidellm
    run = run_aiperf("http://127.0.0.1:8000", "ref", concurrency=64, input_tokens=128,
                     output_tokens=128, request_count=640, out_dir=Path("out/aiperf"), cpu=0)
    print(run.output_tok_s, run.achieved_concurrency(), run.cpu_s)

Smoke entry: ``python -m benchmarks.thirdparty --url http://127.0.0.1:8000 --concurrency 64``.
"""

from benchmarks.thirdparty.aiperf import run_aiperf
from benchmarks.thirdparty.guidellm import run_guidellm
from benchmarks.thirdparty.install import cache_dir, ensure_tokenizer, ensure_tool, tool_dir
from benchmarks.thirdparty.records import TOOL_VERSIONS, RequestRecord, ToolName, ToolRun

__all__ = [
    "TOOL_VERSIONS",
    "RequestRecord",
    "ToolName",
    "ToolRun",
    "cache_dir",
    "ensure_tokenizer",
    "ensure_tool",
    "run_aiperf",
    "run_guidellm",
    "tool_dir",
]
