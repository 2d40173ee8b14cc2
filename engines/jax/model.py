"""Gemma 4's text decoder in `jax.numpy`/`lax`: its shape (`GemmaSpec`, read from a
transformers config), its parameters (seeded random, or safetensors from a Hugging Face
folder) and its two steps over the slot KV cache: `prefill` (one sequence's chunk of
prompt) and `decode` (one token for each of a batch of slots).

The architecture, as transformers' `Gemma4TextModel` computes it: sliding and full
attention layers with their own head sizes and RoPE (default RoPE on sliding layers,
proportional on full ones), query/key RMSNorm and a scale-free value norm with attention
scaling 1, the last `num_kv_shared_layers` layers reusing the KV of the last earlier
layer of their type, per-layer embeddings fed through a gate after each layer, an MLP
twice as wide in the KV-shared layers, a per-layer scalar, and a final logit softcap.

Projections that read the same input are held as one matrix (`fuse_projections`: q, k and
v as `qkv`; gate and up as `gate_up`). XLA's GPU compiler merges such dots by itself, so
the kernels are the same; what it saves is arrays handed to every call of a program.

The cache: full-attention layers keep `[slots, max_len, kv_heads, head]`; sliding layers a
ring of the window's length, `[slots, window, kv_heads, head]`, position p at p mod window
(the window lets position q see keys q - window + 1 ... q, so the ring holds exactly
those). KV-shared layers have no cache of their own. Writes that must not land (padding
tokens, idle slots) go to an index past the end and are dropped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from engines.jax import decode_attention as attention_kernel

Params = dict[str, Any]
Cache = list[tuple[jax.Array, jax.Array]]

_SUPPORTED_ROPE = ("default", "proportional")


@dataclass(frozen=True)
class LayerSpec:
    sliding: bool
    head_dim: int
    kv_heads: int
    intermediate: int
    cache_index: int  # the cache this layer reads (its own, or its KV producer's)
    writes_cache: bool  # False for KV-shared layers


@dataclass(frozen=True)
class GemmaSpec:
    """Everything about the model's shape the steps need, read once from its config."""

    vocab_size: int
    vocab_size_per_layer: int
    hidden: int
    per_layer_dim: int
    heads: int
    layers: tuple[LayerSpec, ...]
    window: int
    softcap: float | None
    eps: float
    rope_sliding: tuple[float, ...]  # inverse frequencies, half the head size
    rope_full: tuple[float, ...]
    tie_embeddings: bool
    max_positions: int

    @property
    def cache_layers(self) -> list[int]:
        """Indices of the layers that own a cache, in cache order."""
        return [i for i, layer in enumerate(self.layers) if layer.writes_cache]


def _inv_freq(rope: dict[str, Any], head_dim: int) -> tuple[float, ...]:
    kind = rope.get("rope_type", "default")
    if kind not in _SUPPORTED_ROPE:
        raise ValueError(f"RoPE type {kind!r} is not supported by the JAX engine")
    base = float(rope["rope_theta"])
    factor = float(rope.get("factor", 1.0))
    if kind == "default":
        exps = np.arange(0, head_dim, 2, dtype=np.float32) / head_dim
        return tuple(float(x) for x in 1.0 / (base**exps))
    angles = int(float(rope.get("partial_rotary_factor", 1.0)) * head_dim // 2)
    exps = np.arange(0, 2 * angles, 2, dtype=np.float32) / head_dim
    rotated = (1.0 / (base**exps)).astype(np.float32)
    inv = np.concatenate([rotated, np.zeros(head_dim // 2 - angles, np.float32)]) / factor
    return tuple(float(x) for x in inv)


def spec_from_config(config: Any) -> GemmaSpec:
    """The spec of a transformers `Gemma4TextConfig` (or a config holding one)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "model_type", "") not in ("gemma4_text", "gemma4"):
        raise ValueError(
            f"the JAX engine serves Gemma 4 text models; this config is {text.model_type!r}"
        )
    if getattr(text, "enable_moe_block", False):
        raise ValueError("Gemma 4 mixture-of-experts layers are not supported by the JAX engine")
    if getattr(text, "attention_k_eq_v", False):
        raise ValueError("attention_k_eq_v models are not supported by the JAX engine")
    if getattr(text, "hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ValueError(f"activation {text.hidden_activation!r} is not supported")
    modes = text.kv_sharing_modes
    types = list(text.layer_types)
    producer: dict[str, int] = {}
    cache_of: dict[int, int] = {}
    layers: list[LayerSpec] = []
    for i, kind in enumerate(types):
        per = text.per_layer_config[i]
        shared = modes[i] == "reuse"
        if not shared:
            cache_of[i] = len(cache_of)
            producer[kind] = i
        wide = 2 if (text.use_double_wide_mlp and shared) else 1
        layers.append(
            LayerSpec(
                sliding=kind == "sliding_attention",
                head_dim=int(per.head_dim),
                kv_heads=int(per.num_key_value_heads),
                intermediate=int(text.intermediate_size) * wide,
                cache_index=cache_of[producer[kind]] if shared else cache_of[i],
                writes_cache=not shared,
            )
        )
    sliding_dim = next((lay.head_dim for lay in layers if lay.sliding), layers[0].head_dim)
    full_dim = next((lay.head_dim for lay in layers if not lay.sliding), layers[0].head_dim)
    rope = text.rope_parameters
    return GemmaSpec(
        vocab_size=int(text.vocab_size),
        vocab_size_per_layer=int(text.vocab_size_per_layer_input or 0),
        hidden=int(text.hidden_size),
        per_layer_dim=int(text.hidden_size_per_layer_input or 0),
        heads=int(text.num_attention_heads),
        layers=tuple(layers),
        window=int(text.sliding_window),
        softcap=text.final_logit_softcapping,
        eps=float(text.rms_norm_eps),
        rope_sliding=_inv_freq(rope["sliding_attention"], sliding_dim),
        rope_full=_inv_freq(rope["full_attention"], full_dim),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
        max_positions=int(text.max_position_embeddings),
    )


# -- parameters ---------------------------------------------------------------------


def _shapes(spec: GemmaSpec) -> dict[str, tuple[int, ...]]:
    """Parameter names (ours) and shapes; projections stored [in, out]."""
    h, p, n_layers = spec.hidden, spec.per_layer_dim, len(spec.layers)
    out: dict[str, tuple[int, ...]] = {
        "embed": (spec.vocab_size, h),
        "final_norm": (h,),
    }
    if p:
        out["embed_per_layer"] = (spec.vocab_size_per_layer, n_layers * p)
        out["per_layer_proj"] = (h, n_layers * p)
        out["per_layer_norm"] = (p,)
    if not spec.tie_embeddings:
        out["lm_head"] = (h, spec.vocab_size)
    for i, lay in enumerate(spec.layers):
        d, q = lay.head_dim, spec.heads * lay.head_dim
        pre = f"layers.{i}."
        out |= {
            pre + "q": (h, q),
            pre + "q_norm": (d,),
            pre + "o": (q, h),
            pre + "in_norm": (h,),
            pre + "post_attn_norm": (h,),
            pre + "pre_ff_norm": (h,),
            pre + "post_ff_norm": (h,),
            pre + "gate": (h, lay.intermediate),
            pre + "up": (h, lay.intermediate),
            pre + "down": (lay.intermediate, h),
            pre + "scalar": (1,),
        }
        if lay.writes_cache:
            out |= {
                pre + "k": (h, lay.kv_heads * d),
                pre + "v": (h, lay.kv_heads * d),
                pre + "k_norm": (d,),
            }
        if p:
            out |= {pre + "pl_gate": (h, p), pre + "pl_proj": (p, h), pre + "pl_norm": (h,)}
    return out


_FUSED = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


def fuse_projections(params: Params, spec: GemmaSpec) -> Params:
    """The checkpoint's per-projection matrices of each layer joined along their outputs
    (`_FUSED`; a KV-shared layer's `qkv` is its q alone), one layer at a time."""
    out = dict(params)
    for i in range(len(spec.layers)):
        pre = f"layers.{i}."
        for fused, parts in _FUSED.items():
            present = [out.pop(pre + part) for part in parts if pre + part in out]
            out[pre + fused] = present[0] if len(present) == 1 else jnp.concatenate(present, 1)
    return out


def _is_norm(name: str) -> bool:
    return name.endswith(("norm", "scalar"))


def random_params(spec: GemmaSpec, dtype: Any, seed: int, std: float, on_host: bool) -> Params:
    """Seeded random weights (normal, `std`), norms and layer scalars at one, one tensor
    at a time in `dtype`: drawn by numpy on the host (`on_host`: quick, no compile), else
    by jax.random on the device (the E2B size is 5 billion draws)."""
    rng = np.random.default_rng(seed)
    key = jax.random.PRNGKey(seed)
    params: Params = {}
    for i, (name, shape) in enumerate(sorted(_shapes(spec).items())):
        if _is_norm(name):
            params[name] = jnp.ones(shape, dtype)
        elif on_host:
            noise = rng.standard_normal(shape, dtype=np.float32)
            noise *= std
            params[name] = jnp.asarray(noise, dtype)
        else:
            draw = jax.random.normal(jax.random.fold_in(key, i), shape, jnp.float32) * std
            params[name] = draw.astype(dtype)
    return fuse_projections(params, spec)


# transformers' names (after the text model's prefix) -> ours, and whether to transpose
_HF_NAMES = {
    "embed_tokens.weight": ("embed", False),
    "norm.weight": ("final_norm", False),
    "embed_tokens_per_layer.weight": ("embed_per_layer", False),
    "per_layer_model_projection.weight": ("per_layer_proj", True),
    "per_layer_projection_norm.weight": ("per_layer_norm", False),
}
_HF_LAYER_NAMES = {
    "self_attn.q_proj.weight": ("q", True),
    "self_attn.k_proj.weight": ("k", True),
    "self_attn.v_proj.weight": ("v", True),
    "self_attn.o_proj.weight": ("o", True),
    "self_attn.q_norm.weight": ("q_norm", False),
    "self_attn.k_norm.weight": ("k_norm", False),
    "input_layernorm.weight": ("in_norm", False),
    "post_attention_layernorm.weight": ("post_attn_norm", False),
    "pre_feedforward_layernorm.weight": ("pre_ff_norm", False),
    "post_feedforward_layernorm.weight": ("post_ff_norm", False),
    "mlp.gate_proj.weight": ("gate", True),
    "mlp.up_proj.weight": ("up", True),
    "mlp.down_proj.weight": ("down", True),
    "per_layer_input_gate.weight": ("pl_gate", True),
    "per_layer_projection.weight": ("pl_proj", True),
    "post_per_layer_input_norm.weight": ("pl_norm", False),
    "layer_scalar": ("scalar", False),
}


def _our_name(hf_name: str) -> tuple[str, bool] | None:
    """Our name for a checkpoint tensor of the text decoder, or None (vision, audio, ...)."""
    if hf_name == "lm_head.weight":
        return "lm_head", True
    for prefix in ("model.language_model.", "model.", "language_model.model.", ""):
        if hf_name.startswith(prefix) and not hf_name.startswith(("model.vision", "model.audio")):
            rest = hf_name[len(prefix) :]
            if rest in _HF_NAMES:
                return _HF_NAMES[rest]
            if rest.startswith("layers."):
                _, index, tail = rest.split(".", 2)
                if tail in _HF_LAYER_NAMES:
                    ours, transpose = _HF_LAYER_NAMES[tail]
                    return f"layers.{index}.{ours}", transpose
    return None


def load_params(folder: Path, spec: GemmaSpec, dtype: Any) -> Params:
    """The decoder's weights from a folder's safetensors files, in `dtype`, checked
    against the spec's shapes; defaults (ones) for layer scalars a checkpoint lacks."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"--model: no .safetensors files in {folder}")
    shapes = _shapes(spec)
    params: Params = {}
    for path in files:
        with safe_open(str(path), framework="flax") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                mapped = _our_name(name)
                if mapped is None or mapped[0] not in shapes:
                    continue
                ours, transpose = mapped
                tensor = f.get_tensor(name)
                tensor = tensor.T if transpose else tensor
                params[ours] = jnp.asarray(tensor, dtype).reshape(shapes[ours])
    for name, shape in shapes.items():
        if name not in params:
            if name.endswith("scalar"):
                params[name] = jnp.ones(shape, dtype)
            else:
                raise ValueError(f"--model: {folder} has no weight for {name}")
    return fuse_projections(params, spec)


def read_config(folder: Path) -> Any:
    from transformers import AutoConfig

    if not (folder / "config.json").exists():
        raise ValueError(f"--model: {folder} has no config.json")
    json.loads((folder / "config.json").read_text())  # a clear error for a broken file
    return AutoConfig.from_pretrained(str(folder))


# -- the steps ----------------------------------------------------------------------


def _rms(x: jax.Array, weight: jax.Array | None, eps: float) -> jax.Array:
    xf = x.astype(jnp.float32)
    normed = xf * jnp.power(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps, -0.5)
    if weight is not None:
        normed = normed * weight.astype(jnp.float32)
    return normed.astype(x.dtype)


def _rope(x: jax.Array, positions: jax.Array, inv_freq: tuple[float, ...]) -> jax.Array:
    """x [..., T, heads, d] rotated by positions [..., T] (transformers' rotate_half form)."""
    freqs = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq, jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    cos = jnp.cos(emb).astype(x.dtype)[..., None, :]
    sin = jnp.sin(emb).astype(x.dtype)[..., None, :]
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """q [B, T, H, d], k/v [B, S, Hkv, d], mask [B, T, S] -> [B, T, H * d]. Scale 1."""
    b, t, h, d = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, t, kv, h // kv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
    # A finite floor and zeroed weights: a row with nothing visible (a padding query, an
    # idle slot) gives zeros, not NaN, and a NaN never reaches the real rows through 0 * v.
    visible = mask[:, None, None]
    scores = jnp.where(visible, scores, -1e30)
    probs = jnp.where(visible, jax.nn.softmax(scores, axis=-1), 0.0).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h * d)


def _embed(params: Params, spec: GemmaSpec, tokens: jax.Array) -> tuple[jax.Array, Any]:
    dtype = params["embed"].dtype
    x = params["embed"][tokens] * jnp.asarray(spec.hidden**0.5, dtype)
    if not spec.per_layer_dim:
        return x, None
    n, p = len(spec.layers), spec.per_layer_dim
    ids = jnp.where(tokens < spec.vocab_size_per_layer, tokens, 0)
    token_part = params["embed_per_layer"][ids] * jnp.asarray(p**0.5, dtype)
    token_part = token_part.reshape(*tokens.shape, n, p)
    proj = (x @ params["per_layer_proj"]) * jnp.asarray(spec.hidden**-0.5, dtype)
    proj = _rms(proj.reshape(*tokens.shape, n, p), params["per_layer_norm"], spec.eps)
    per_layer = (proj + token_part) * jnp.asarray(2.0**-0.5, dtype)
    # One array for every layer: left to itself, XLA computes each layer's slice (its
    # norm) in a kernel of its own at the step's start, 35 launches for E2B.
    return x, jax.lax.optimization_barrier(per_layer)


def _layer_tail(
    params: Params, spec: GemmaSpec, i: int, x: jax.Array, attn: jax.Array, per_layer: Any
) -> jax.Array:
    pre = f"layers.{i}."
    x = x + _rms(attn @ params[pre + "o"], params[pre + "post_attn_norm"], spec.eps)
    h = _rms(x, params[pre + "pre_ff_norm"], spec.eps)
    gate, up = jnp.split(h @ params[pre + "gate_up"], 2, axis=-1)
    h = jax.nn.gelu(gate, approximate=True) * up
    x = x + _rms(h @ params[pre + "down"], params[pre + "post_ff_norm"], spec.eps)
    if per_layer is not None:
        g = jax.nn.gelu(x @ params[pre + "pl_gate"], approximate=True) * per_layer[..., i, :]
        x = x + _rms(g @ params[pre + "pl_proj"], params[pre + "pl_norm"], spec.eps)
    return x * params[pre + "scalar"]


def _qkv(
    params: Params, spec: GemmaSpec, i: int, h: jax.Array, positions: jax.Array
) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    lay = spec.layers[i]
    pre = f"layers.{i}."
    inv = spec.rope_sliding if lay.sliding else spec.rope_full
    lead = h.shape[:-1]
    qkv = h @ params[pre + "qkv"]
    width_q, width_kv = spec.heads * lay.head_dim, lay.kv_heads * lay.head_dim
    q = qkv[..., :width_q].reshape(*lead, spec.heads, lay.head_dim)
    q = _rope(_rms(q, params[pre + "q_norm"], spec.eps), positions, inv)
    if not lay.writes_cache:
        return q, None, None
    k = qkv[..., width_q : width_q + width_kv].reshape(*lead, lay.kv_heads, lay.head_dim)
    v = qkv[..., width_q + width_kv :].reshape(*lead, lay.kv_heads, lay.head_dim)
    k = _rope(_rms(k, params[pre + "k_norm"], spec.eps), positions, inv)
    return q, k, _rms(v, None, spec.eps)


def _logits(params: Params, spec: GemmaSpec, x: jax.Array, bias: jax.Array) -> jax.Array:
    x = _rms(x, params["final_norm"], spec.eps)
    head = params["lm_head"] if "lm_head" in params else params["embed"].T
    logits = (x @ head).astype(jnp.float32)
    if spec.softcap is not None:
        logits = jnp.tanh(logits / spec.softcap) * spec.softcap
    return logits + bias


def ring_positions(last: jax.Array, window: int) -> jax.Array:
    """The position each ring entry holds when `last` is the latest written ([..., W]);
    negative: never written for this sequence."""
    i = jnp.arange(window)
    return last[..., None] - jnp.mod(last[..., None] - i, window)


def prefill(
    params: Params,
    spec: GemmaSpec,
    cache: Cache,
    tokens: jax.Array,
    start: jax.Array,
    length: jax.Array,
    slot: jax.Array,
    bias: jax.Array,
    kv_len: int,
) -> tuple[Cache, jax.Array]:
    """One chunk of one sequence's prompt: `tokens` [T] (the first `length` real) at
    positions start ... start + T - 1, into cache slot `slot`; full layers read the first
    `kv_len` cached positions. Returns the cache and the last real token's logits [V]."""
    t = tokens.shape[0]
    positions = start + jnp.arange(t)
    real = jnp.arange(t) < length
    x, per_layer = _embed(params, spec, tokens)
    cache = list(cache)
    shared: dict[bool, tuple[jax.Array, jax.Array, jax.Array]] = {}
    w = spec.window
    for i, lay in enumerate(spec.layers):
        h = _rms(x, params[f"layers.{i}.in_norm"], spec.eps)
        q, k, v = _qkv(params, spec, i, h, positions)
        if k is not None and v is not None:
            ck, cv = cache[lay.cache_index]
            if lay.sliding:
                old = ring_positions(start - 1, w)
                ring_k = jax.lax.dynamic_index_in_dim(ck, slot, keepdims=False)
                ring_v = jax.lax.dynamic_index_in_dim(cv, slot, keepdims=False)
                keys = jnp.concatenate([ring_k, k])
                values = jnp.concatenate([ring_v, v])
                key_pos = jnp.concatenate([old, positions])
                valid = jnp.concatenate([old >= 0, real])
                gap = positions[:, None] - key_pos[None, :]
                mask = valid[None, :] & (gap >= 0) & (gap < w)
                keep = real & (jnp.arange(t) >= length - w)
                idx = jnp.where(keep, jnp.mod(positions, w), w)
            else:
                idx = jnp.where(real, positions, ck.shape[1])
            ck = ck.at[slot, idx].set(k, mode="drop")
            cv = cv.at[slot, idx].set(v, mode="drop")
            cache[lay.cache_index] = (ck, cv)
            if not lay.sliding:
                size = (1, kv_len, *ck.shape[2:])
                keys = jax.lax.dynamic_slice(ck, (slot, 0, 0, 0), size)[0]
                values = jax.lax.dynamic_slice(cv, (slot, 0, 0, 0), size)[0]
                mask = jnp.arange(kv_len)[None, :] <= positions[:, None]
            shared[lay.sliding] = (keys, values, mask)
        keys, values, mask = shared[lay.sliding]
        attn = _attend(q[None], keys[None], values[None], mask[None])[0]
        x = _layer_tail(params, spec, i, x, attn, per_layer)
    last = jax.lax.dynamic_index_in_dim(x, length - 1, keepdims=False)
    return cache, _logits(params, spec, last, bias)


def decode(
    params: Params,
    spec: GemmaSpec,
    cache: Cache,
    tokens: jax.Array,
    positions: jax.Array,
    slots: jax.Array,
    bias: jax.Array,
    kv_len: int,
    attention: str = "xla",
) -> tuple[Cache, jax.Array]:
    """One token for each row: `tokens`, `positions`, `slots` [rows] (a padding row has
    position -1 and a slot past the last: it reads clamped garbage it cannot see and
    writes nothing); full layers read the first `kv_len` positions. `attention`: "xla"
    (XLA's own kernels), "pallas" (`decode_attention`'s kernel, for layers it supports)
    or "pallas-interpret" (the same kernel in Pallas's interpreter, for a CPU). Returns
    the cache and logits [rows, V]."""
    active = positions >= 0
    x, per_layer = _embed(params, spec, tokens)
    cache = list(cache)
    shared: dict[bool, tuple[jax.Array, jax.Array, jax.Array]] = {}
    w = spec.window
    for i, lay in enumerate(spec.layers):
        h = _rms(x, params[f"layers.{i}.in_norm"], spec.eps)
        q, k, v = _qkv(params, spec, i, h, positions)
        length = w if lay.sliding else kv_len
        if k is not None and v is not None:
            ck, cv = cache[lay.cache_index]
            if lay.sliding:
                idx = jnp.where(active, jnp.mod(positions, w), w)
            else:
                idx = jnp.where(active, positions, ck.shape[1])
            ck = ck.at[slots, idx].set(k, mode="drop")
            cv = cv.at[slots, idx].set(v, mode="drop")
            cache[lay.cache_index] = (ck, cv)
            # Entries [0, visible) of the ring or the full cache are the row's to see.
            visible = jnp.where(active, jnp.minimum(positions + 1, length), 0)
            shared[lay.sliding] = (ck, cv, visible)
        ck, cv, visible = shared[lay.sliding]
        group = spec.heads // lay.kv_heads
        if attention != "xla" and attention_kernel.supported(length, lay.head_dim, group):
            attn = attention_kernel.decode_attention(
                q, ck, cv, slots, visible, length=length,
                interpret=attention == "pallas-interpret",
            )  # fmt: skip
        else:
            keys, values = ck[slots, :length], cv[slots, :length]
            mask = jnp.arange(length)[None, :] < visible[:, None]
            attn = _attend(q[:, None], keys, values, mask[:, None])[:, 0]
        x = _layer_tail(params, spec, i, x, attn, per_layer)
    return cache, _logits(params, spec, x, bias)


def new_cache(spec: GemmaSpec, slots: int, max_len: int, dtype: Any) -> Cache:
    """Zeroed KV for every cache-owning layer: full length, or the window's ring."""
    cache: Cache = []
    for i in spec.cache_layers:
        lay = spec.layers[i]
        length = spec.window if lay.sliding else max_len
        shape = (slots, length, lay.kv_heads, lay.head_dim)
        cache.append((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)))
    return cache


def cache_nbytes(cache: Cache) -> int:
    return sum(int(k.nbytes) + int(v.nbytes) for k, v in cache)


def streamed_weight_count(spec: GemmaSpec) -> int:
    """Weights a decode step reads in full: every projection and norm, and the head (the
    tied embedding, or its own); the per-layer embeddings and an untied embedding are
    gathers, a row a token."""
    skip = {"embed_per_layer"} | (set() if spec.tie_embeddings else {"embed"})
    return sum(math.prod(shape) for name, shape in _shapes(spec).items() if name not in skip)


def param_count(params: Params) -> int:
    return sum(math.prod(p.shape) for p in params.values())
