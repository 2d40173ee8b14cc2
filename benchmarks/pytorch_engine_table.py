"""The table `benchmarks.pytorch_engine_h200` prints last: one row per measure of its
`result.json` sections (roofline, `generate()`, the model step by mode, the server sweep,
each server's greedy text, and the targets), each cell `n/a` where a section did not run or failed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["table"]


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def _server_cell(c: dict[str, Any], ttft: bool = False) -> str:
    """One sweep cell of a server run, as the table shows it."""
    ttft_text = f", TTFT p50 {_fmt(c['ttft_ms_p50_median'])} ms" if ttft else ""
    low, high = c.get("aggregate_output_tok_s_min"), c.get("aggregate_output_tok_s_max")
    # Passes of one cell spread by a few percent: a ratio between two servers that falls
    # inside that spread is not a difference.
    spread = f" (passes {_fmt(low)} to {_fmt(high)})" if low is not None and low != high else ""
    return (
        f"aggregate {_fmt(c['aggregate_output_tok_s_median'])} tok/s{spread}, per request "
        f"{_fmt(c['per_request_decode_tok_s'])} tok/s{ttft_text}, server step "
        f"{_fmt(c['server_decode_step_ms_mean'], '.2f')} ms x "
        f"{_fmt(c['server_decode_rows_mean'])} rows (device "
        f"{_fmt(c.get('server_decode_device_ms_mean'), '.2f')} ms, idle between steps "
        f"{_fmt(c.get('server_decode_device_idle_ms_mean'), '.3f')} ms)"
    )


def _greedy_cell(g: dict[str, Any]) -> str:
    """A server's greedy text: repeated within the run, and against a reference run."""
    digest = g["texts_sha256"]
    text = f"{g['repeat_identical']}/{g['prompts']} prompts repeat within the run"
    if g["requests_failed"]:
        text += f", {g['requests_failed']} requests failed"
    text += f"; texts {digest[:12]}" if digest else "; no digest"
    if "same_as_reference" in g:
        verdicts = {True: "same", False: "differs", None: "nothing to compare"}
        text += ", reference run: " + verdicts[g["same_as_reference"]]
    return text


def table(data: dict[str, Any]) -> str:
    s = data["sections"]
    lines = ["| measure | value |", "| --- | --- |"]
    env = s.get("environment") or {}
    lines.append(
        f"| GPU | {env.get('gpu')} (torch {env.get('torch')}, transformers "
        f"{env.get('transformers')}) |"
    )
    roof = s.get("roofline") or {}
    r_tok = roof.get("roofline_tok_s_batch1")
    if roof:
        lines.append(
            f"| roofline ({roof.get('quantize', 'none')}) | "
            f"{roof['weight_bytes_streamed'] / 1e9:.2f} GB weights / "
            f"{roof['copy_bandwidth_gb_s']:.0f} GB/s = {roof['roofline_step_ms']:.3f} ms/step "
            f"= {r_tok:.0f} tok/s at batch 1 |"
        )
    gen = (s.get("generate") or {}).get("tok_s")
    lines.append(f"| transformers generate(), batch 1 | {_fmt(gen)} tok/s |")
    for name, label in (
        ("step_rowwise_eager", "engine step, row-by-row attention, eager (before)"),
        ("step_batched_eager", "engine step, batched attention, eager"),
        ("step_batched_graphs_unfused", "engine step, batched attention, CUDA graphs"),
        ("step_batched_graphs", "engine step, batched, CUDA graphs, fused norms"),
        ("step_program_graphs", "engine step, decode program, CUDA graphs, eager, cuBLAS"),
        ("step_program_graphs_gemv", "engine step, decode program + Triton GEMV, CUDA graphs"),
    ):
        mode = s.get(name)
        if not mode:
            continue
        cells = ", ".join(
            f"b{d['batch']}: {d['decode_step_ms_median']:.2f} ms = {d['decode_tok_s']:.0f} tok/s"
            for d in mode["decode"]
        )
        lines.append(f"| {label} | {cells} |")
    reference_tokens = None
    for name, mode in s.items():
        if not name.startswith(("compile-", "variant-")) or not mode:
            continue
        bench = mode.get("stepbench")
        if not bench:
            tail = (mode.get("stderr_tail") or "").strip().splitlines()[-1:]
            lines.append(f"| engine step, {name} | failed: {tail} |")
            continue
        # The context matters: a step reads its KV bucket (about +0.24 ms from 128 to 600
        # tokens on an H200), and the sweep's requests run from 129 to 640 tokens.
        cells = ", ".join(
            f"b{d['batch']}: {d['decode_step_ms_median']:.3f} ms = {d['decode_tok_s']:.0f} tok/s"
            f" ({_fmt(d.get('decode_step_ms_queued'), '.3f')} ms queued)"
            f" at {d['prompt_len']} tokens of context"
            for d in bench["decode"]
        )
        for prof in bench.get("profiles", [])[:1]:
            cells += (
                f"; profile b{prof['batch']}: wall {prof['step_wall_ms']:.3f} ms, GPU "
                f"{prof['device_time_ms']:.3f} ms in {prof['device_kernels']} kernels"
            )
        tokens = bench.get("greedy_tokens_batch1")
        if tokens:
            reference_tokens = reference_tokens or tokens
            same = sum(a == b for a, b in zip(tokens, reference_tokens, strict=False))
            cells += f"; greedy tokens equal to the first variant's: {same}/{len(tokens)}"
        flags = " ".join(mode.get("flags", [])) or "program, compiled, Triton GEMV"
        lines.append(f"| engine step, {name} ({flags}) | {cells} |")
    for name in ("step_batched_graphs", "step_program_graphs", "step_program_graphs_gemv"):
        for p in (s.get(name) or {}).get("profiles", []):
            top = "; ".join(
                f"{k['kernel'][:48]} {k['ms']:.3f} ms x{k['count']}" for k in p["top_kernels"][:4]
            )
            lines.append(
                f"| profile, {name}, batch {p['batch']} | wall {p['step_wall_ms']:.3f} ms, "
                f"GPU {p['device_time_ms']:.3f} ms in {p['device_kernels']} kernels "
                f"(busy {_fmt(p['device_busy_fraction'], '.0%')}); top: {top} |"
            )
    eager = s.get("step_rowwise_eager")
    if eager:
        p = eager["profiles"][0]
        lines.append(
            f"| profile, row-by-row eager, batch 1 | wall {p['step_wall_ms']:.1f} ms, GPU "
            f"{p['device_time_ms']:.2f} ms in {p['device_kernels']} kernels |"
        )
    for name, variant in s.items():
        if name.startswith("server-") and variant:
            argv = variant["argv"]
            flags = " ".join(argv[argv.index("--max-running") + 2 :])
            for level, c in variant.get("cells", {}).items():
                lines.append(f"| {name} ({flags}), {level} concurrent | {_server_cell(c)} |")
    server = s.get("server") or {}
    cells = server.get("cells", {})
    for level, c in cells.items():
        lines.append(
            f"| server, {level} concurrent ({server.get('shape')}) | {_server_cell(c, ttft=True)} |"
        )
    for name, section in s.items():
        greedy = section.get("greedy") if name.startswith("server") and section else None
        if greedy:
            lines.append(f"| greedy text, {name} | {_greedy_cell(greedy)} |")
    b1 = (cells.get("1") or {}).get("aggregate_output_tok_s_median")
    # Decode alone (1 / TPOT, no prefill), which is what the weight-streaming roofline bounds.
    b1_decode = (cells.get("1") or {}).get("per_request_decode_tok_s")
    b64 = (cells.get("64") or {}).get("aggregate_output_tok_s_median")
    step1 = None
    fastest = s.get("step_program_graphs") or s.get("step_batched_graphs")
    if fastest:
        step1 = fastest["decode"][0]["decode_tok_s"]
    compiled = (s.get("compile-default") or {}).get("stepbench")
    variants = [v["stepbench"] for k, v in s.items() if k.startswith("variant-") and v]
    if compiled or any(variants):  # the serving default on CUDA, or its first variant
        step1 = (compiled or next(v for v in variants if v))["decode"][0]["decode_tok_s"]
    if r_tok:
        lines.append(
            f"| batch 1 vs roofline (target >= 50%) | server {_fmt(b1 and 100 * b1 / r_tok)}% "
            f"aggregate, {_fmt(b1_decode and 100 * b1_decode / r_tok)}% decode rate; "
            f"model step {_fmt(step1 and 100 * step1 / r_tok)}% |"
        )
    if gen:
        lines.append(
            f"| batch 1 vs generate() (target >= 5x) | server {_fmt(b1 and b1 / gen)}x, "
            f"model step {_fmt(step1 and step1 / gen)}x |"
        )
    lines.append(f"| aggregate 64 vs batch 1 (target >= 15x) | {_fmt(b1 and b64 and b64 / b1)}x |")
    return "\n".join(lines)
