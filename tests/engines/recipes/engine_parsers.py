"""Dry parse of server argv by an engine's own argument parser, inside that engine's venv.

Run as `<engine venv>/bin/python engine_parsers.py ENGINE` with a JSON list of argv lists
(each starting after `python -m <module>`) on stdin; prints one JSON object per argv:
{"ok": bool, "error": str | null, "seen": {...}}. Standalone on purpose: the engine's venv
has the engine, not this project. Nothing is served: each parser is run exactly as its
launcher runs it, and stopped before the engine starts.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def _vllm(argv: list[str]) -> dict[str, object]:
    # Building vLLM's parser instantiates config defaults, which ask the platform for a
    # device; a CPU-only machine has none, so use vLLM's CPU platform as `vllm bench` does.
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    import vllm.entrypoints.cli.serve as serve
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(required=False, dest="subparser")
    cmds = {}
    for cmd in serve.cmd_init():
        cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
        cmds[cmd.name] = cmd
    args = parser.parse_args(argv)
    cmds[args.subparser].validate(args)
    # What `vllm serve`'s command does first: the positional model tag is the model.
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    engine_args = AsyncEngineArgs.from_cli_args(args)
    keys = ("model", "gpu_memory_utilization", "max_num_seqs", "max_model_len", "dtype",
            "kv_cache_dtype", "language_model_only", "speculative_config")  # fmt: skip
    return {k: repr(getattr(engine_args, k, None)) for k in keys}


def _sglang(argv: list[str]) -> dict[str, object]:
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(argv)
    keys = (
        "model_path", "mem_fraction_static", "max_running_requests", "context_length",
        "cuda_graph_max_bs_decode", "dtype", "kv_cache_dtype", "speculative_algorithm",
        "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
        "speculative_num_draft_tokens",
    )  # fmt: skip
    return {k: repr(getattr(args, k, None)) for k in keys}


def _litert(argv: list[str]) -> dict[str, object]:
    import click
    from litert_lm_cli import config as cli_config
    from litert_lm_cli import main

    group = main.cli
    ctx = group.make_context("litert-lm", list(argv), resilient_parsing=False)
    name, cmd, rest = group.resolve_command(ctx, ctx.protected_args + ctx.args)
    if cmd is None:
        raise click.UsageError(f"no command {name!r}")
    sub = cmd.make_context(name, rest, parent=ctx)
    seen = {k: repr(v) for k, v in sub.params.items()}
    # `--config` is eager and not exposed: its callback sets the config path. The file is
    # the half of LiteRT-LM's serving flags that is not argv: load it through LiteRT-LM's
    # own loader, which validates it against its JSON schema.
    path = cli_config.get_config_path()
    seen["config"] = path
    seen["default"] = repr(cli_config.load_config(path).default)
    return seen


PARSERS = {"vllm": _vllm, "sglang": _sglang, "litert-lm": _litert}


def main() -> int:
    engine = sys.argv[1]
    argvs = json.load(sys.stdin)
    out = []
    for argv in argvs:
        noise = io.StringIO()
        try:
            with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
                seen = PARSERS[engine](argv)
            out.append({"ok": True, "error": None, "seen": seen})
        except SystemExit as exc:  # argparse's way of rejecting
            out.append({"ok": False, "error": f"exit {exc.code}: {noise.getvalue()[-1500:]}"})
        except Exception as exc:  # every rejection is reported, not raised
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"[-1500:]})
    print("ENGINE-PARSERS-RESULT " + json.dumps(out))  # the protocol is stdout
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
