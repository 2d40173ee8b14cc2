"""The `random:<name>` models both engines serve without a download: transformers configs
built in code around the byte tokenizer's special ids, with the limits each is served at.

Configs only (no torch): the PyTorch engine builds transformers models from them, the JAX
engine its own parameters, so `random:tiny-gemma4` is the same architecture in both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from transformers import Gemma4TextConfig, LlamaConfig, PretrainedConfig, PreTrainedTokenizerBase

RANDOM_PREFIX = "random:"
# Long enough for the sweep's 512+128 shapes with room; the cache grows only as used.
DEFAULT_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class RandomModelSpec:
    """A model made in code: a config builder (given the tokenizer's ids) and its limits."""

    name: str
    description: str
    build_config: Callable[[PreTrainedTokenizerBase], PretrainedConfig]
    max_model_len: int


class _TokenIds(TypedDict):
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None


def _token_ids(tok: PreTrainedTokenizerBase) -> _TokenIds:
    return _TokenIds(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def _tiny_config(tok: PreTrainedTokenizerBase) -> PretrainedConfig:
    # Small enough for hundreds of tokens/s at batch 1 on one CPU core, big enough to have
    # grouped-query attention and several layers, so the cache paths are exercised.
    # Untied head and a wider init than transformers' 0.02: with the default, the residual
    # stream is mostly the last token's embedding and greedy text repeats that token
    # forever; this way greedy text varies with the context and sampling still meets EOS
    # (about 0.4% a token), which the stop and ignore_eos tests rely on.
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        initializer_range=0.05,
        **_token_ids(tok),
    )


def _tiny_gemma4_config(tok: PreTrainedTokenizerBase) -> PretrainedConfig:
    # Gemma 4's text features at toy size: sliding and full layers with different head
    # sizes, KV sharing in the last layers, per-layer embeddings, double-wide MLP, softcap.
    return Gemma4TextConfig(
        vocab_size=len(tok),
        vocab_size_per_layer_input=len(tok),
        hidden_size=64,
        hidden_size_per_layer_input=8,
        intermediate_size=128,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        # Read from **kwargs by Gemma4TextConfig.__post_init__, so not in its signature.
        global_head_dim=32,  # type: ignore[call-arg]
        sliding_window=16,
        layer_types=[
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
        ],
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        final_logit_softcapping=30.0,
        max_position_embeddings=4096,
        **_token_ids(tok),
    )


def _gemma4_e2b_config(tok: PreTrainedTokenizerBase) -> PretrainedConfig:
    # google/gemma-4-E2B-it's text_config: 35 layers (4 sliding : 1 full), width 1536,
    # 8 query heads and 1 KV head, head size 256 (sliding) / 512 (full), a 512-token
    # window, the last 20 layers reusing KV, per-layer embeddings of 256 over the full
    # 262,144-token vocabulary. The byte tokenizer only supplies the special-token ids.
    return Gemma4TextConfig(
        vocab_size=262_144,
        vocab_size_per_layer_input=262_144,
        hidden_size=1536,
        hidden_size_per_layer_input=256,
        intermediate_size=6144,
        num_hidden_layers=35,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=256,
        global_head_dim=512,  # type: ignore[call-arg]  # as above
        sliding_window=512,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
        num_kv_shared_layers=20,
        use_double_wide_mlp=True,
        attention_k_eq_v=False,
        final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        max_position_embeddings=131_072,
        rope_parameters={
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 1_000_000.0,
            },
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        tie_word_embeddings=True,
        **_token_ids(tok),
    )


RANDOM_MODELS: dict[str, RandomModelSpec] = {
    spec.name: spec
    for spec in (
        RandomModelSpec("tiny", "4-layer Llama, width 256, CPU tests", _tiny_config, 4096),
        RandomModelSpec(
            "tiny-gemma4", "Gemma 4 text features at toy size", _tiny_gemma4_config, 4096
        ),
        RandomModelSpec(
            "gemma-4-e2b",
            "Gemma 4 E2B text architecture (~5.1B stored params), GPU benchmarks",
            _gemma4_e2b_config,
            DEFAULT_MAX_MODEL_LEN,
        ),
    )
}
