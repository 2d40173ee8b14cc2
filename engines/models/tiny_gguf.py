"""A tiny llama-architecture GGUF model with random weights, written locally (no download).

This module owns the model that the test suite and `bench run`'s embedded default serve on
llama.cpp: its shape, its vocabulary, its chat template, and the trick that keeps its
random output well-formed. Same seed and arguments, same bytes.

Vocabulary (SentencePiece 'llama' model, no space prefix, no BOS added by default):

    0 <unk>   1 <s> (BOS)   2 </s> (EOS)   3..258 <0x00>..<0xFF> (byte tokens)
    259 '▁' (space)   260 <|im_start|>   261 <|im_end|> (end of turn)

With no multi-byte pieces, every UTF-8 byte of a text is one token (a space is the '▁'
token), so a prompt's token count is its UTF-8 byte length: exact prompt lengths need no
tokenizer at all, and `/tokenize` confirms them.

Output shape: dimension 0 of the residual stream is a constant "anchor" that no layer
writes to and no layer reads; the output head turns it into a large positive logit for
printable ASCII (and the space) and a large negative one for everything else. So greedy or
sampled text is always printable ASCII, one character per token and so one streamed chunk
per token, and the model never ends a reply by itself: output length is max_tokens.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

log = logging.getLogger(__name__)

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
BYTE0_ID = 3  # <0x00>; byte b is token BYTE0_ID + b
SPACE_ID = BYTE0_ID + 256  # '▁'
IM_START_ID = SPACE_ID + 1
IM_END_ID = SPACE_ID + 2
VOCAB_SIZE = IM_END_ID + 1

# ChatML, as Qwen uses it; `enable_thinking=false` closes an empty think block the way
# Qwen3's template does, so "thinking off" changes the prompt exactly as on a real model.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

# Logit pushed into the allowed / forbidden tokens through the anchor (see docstring).
ANCHOR_VALUE = 4.0
ANCHOR_GAIN = 20.0


@dataclass(frozen=True)
class TinyModelShape:
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 128
    n_ctx_train: int = 4096
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Token texts, scores and types for the byte-level SPM vocabulary."""
    tt = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL] + [tt.BYTE] * 256
    tokens += ["\u2581", "<|im_start|>", "<|im_end|>"]
    types += [tt.NORMAL, tt.CONTROL, tt.CONTROL]
    scores = [0.0] * len(tokens)
    assert len(tokens) == VOCAB_SIZE
    return tokens, scores, [int(t) for t in types]


def allowed_output_ids() -> list[int]:
    """The tokens the model may generate: printable ASCII bytes and the space piece."""
    return [BYTE0_ID + b for b in range(0x21, 0x7F)] + [SPACE_ID]


def expected_token_count(text: str) -> int:
    """Tokens `text` becomes (without BOS): one per UTF-8 byte."""
    return len(text.encode("utf-8"))


def _weights(shape: TinyModelShape, seed: int) -> dict[str, np.ndarray]:
    """Random f32 weights in llama.cpp's tensor names; numpy shapes are (out, in)."""
    rng = np.random.default_rng(seed)
    e, f, v = shape.n_embd, shape.n_ff, VOCAB_SIZE
    kv = shape.head_dim * shape.n_head_kv

    def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * (scale / np.sqrt(cols))).astype(np.float32)

    t: dict[str, np.ndarray] = {}
    embd = rng.standard_normal((v, e)).astype(np.float32)
    embd[:, 0] = ANCHOR_VALUE
    t["token_embd.weight"] = embd
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        norm = np.ones(e, dtype=np.float32)
        norm[0] = 0.0  # layers never read the anchor
        t[p + "attn_norm.weight"] = norm
        # Larger q/k than a trained model's init: sharper attention makes the next token
        # depend on the context, not only on the last token (fewer short loops).
        t[p + "attn_q.weight"] = mat(e, e, 3.0)
        t[p + "attn_k.weight"] = mat(kv, e, 3.0)
        t[p + "attn_v.weight"] = mat(kv, e, 1.5)
        out = mat(e, e, 1.5)
        out[0, :] = 0.0  # ... and never write it
        t[p + "attn_output.weight"] = out
        t[p + "ffn_norm.weight"] = norm.copy()
        t[p + "ffn_gate.weight"] = mat(f, e, 1.5)
        t[p + "ffn_up.weight"] = mat(f, e, 1.5)
        down = mat(e, f, 1.5)
        down[0, :] = 0.0
        t[p + "ffn_down.weight"] = down
    out_norm = np.ones(e, dtype=np.float32)
    out_norm[0] = ANCHOR_GAIN
    t["output_norm.weight"] = out_norm
    head = mat(v, e, 1.0)
    head[:, 0] = -1.0
    head[allowed_output_ids(), 0] = 1.0
    t["output.weight"] = head
    return t


def write_tiny_gguf(
    path: Path,
    *,
    seed: int = 0,
    n_ctx_train: int = 4096,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 4,
    n_ff: int = 128,
    add_bos: bool = False,
    name: str = "tiny-random-llama",
) -> Path:
    """Write the tiny model to `path` (atomically) and return `path`."""
    shape = TinyModelShape(
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        n_ctx_train=n_ctx_train,
    )
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError(f"n_embd {n_embd} / n_head {n_head} / n_head_kv {n_head_kv} do not divide")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")

    w = gguf.GGUFWriter(tmp, arch="llama")
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(VOCAB_SIZE)
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_freq_base)
    w.add_layer_norm_rms_eps(shape.rms_eps)

    tokens, scores, types = vocabulary()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_eot_token_id(IM_END_ID)
    w.add_pad_token_id(UNK_ID)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(False)
    # SPM would otherwise prepend a space to every text, breaking tokens == bytes.
    w.add_add_space_prefix(False)
    w.add_chat_template(CHAT_TEMPLATE)

    for tensor_name, data in _weights(shape, seed).items():
        w.add_tensor(tensor_name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    log.info("wrote tiny GGUF %s (seed %d, %d bytes)", path, seed, path.stat().st_size)
    return path


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engines.models.tiny_gguf",
        description="Write a tiny random-weight llama GGUF (byte-level vocabulary, ChatML "
        "template) that llama.cpp serves; no download.",
    )
    parser.add_argument("out", type=Path, help="output .gguf path")
    parser.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    parser.add_argument(
        "--n-ctx-train", type=int, default=4096, help="trained context (default 4096)"
    )
    parser.add_argument("--add-bos", action="store_true", help="make the tokenizer add BOS")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    out = write_tiny_gguf(
        args.out, seed=args.seed, n_ctx_train=args.n_ctx_train, add_bos=args.add_bos
    )
    print(out)  # noqa: T201 (CLI output)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
