"""Decode programs: a model's batched decode step written directly in tensor operations,
on the model's own weights, for the architectures where transformers' module tree is the
limit of the CUDA fast path.

Why: with CUDA graphs and fused norms the Gemma 4 E2B step through transformers' modules
still runs about 1,300 kernels, far from the weight-streaming roofline (measured:
`benchmarks/records/`): 7 skinny projections and ~30 small elementwise kernels per layer.
A program
cuts that in two ways:
- merged projections: q/k/v become one matrix-vector product, gate/up another (the
  modules' weights become views of the merged matrices, so prefill, which still runs
  through transformers, shares the memory);
- per-layer compilation: `layer` is one function of tensors that torch.compile can fuse
  (norms, rotary, cache writes, masks, activations, residuals) into a few kernels; the
  layers of one kind share a compiled graph, so compiling costs a handful of small graphs,
  not the whole 35-layer model per shape.

The arithmetic follows transformers' Gemma 4 modules operation by operation (norms in
float32 through `torch.rms_norm`, as the engine's fused norms do; rotary from the model's
own tables; the same masked attention as `kv_cache.batched_decode_attention`), and a test
checks the logits against transformers' forward on the same pools.

A program is chosen by the model's class name (`PROGRAMS`); a model it does not support
(a feature it does not implement) keeps the generic step, with the reason logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from contract.errors import BenchError
from engines.pytorch import attention_kernel, int4, int4_blocks, kernels
from engines.pytorch.config import ATTENTION_FORMS
from engines.pytorch.kernels import Weight
from engines.pytorch.kv_cache import SlotKVCache, hidden_keys

log = logging.getLogger(__name__)

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "silu": F.silu,
}


class UnsupportedModel(BenchError, ValueError):
    """The model has a feature the program does not implement (the generic step runs)."""


def _merge_linears(linears: list[Any]) -> Weight:
    """One (sum of outs, in) matrix for several projections of the same input; each
    module's weight becomes a view of its rows, so nothing is stored twice. Int4
    projections merge their packed rows and their scale rows alike: consecutive weights of
    a layer's int4 block are already one matrix (`int4_blocks.joined`)."""
    if all(isinstance(m, int4.Int4Linear) for m in linears):
        joined = int4_blocks.joined(linears)
        if joined is not None:
            return joined
        packed = torch.cat([m.packed for m in linears], dim=0).contiguous()
        scale = torch.cat([m.scale for m in linears], dim=0).contiguous()
        row = 0
        for m in linears:
            n = m.out_features
            m.packed, m.scale = packed[row : row + n], scale[row : row + n]
            m.block = None
            row += n
        return packed, scale
    if any(isinstance(m, int4.Int4Linear) for m in linears):
        raise UnsupportedModel("projections of one input partly int4")
    merged = torch.cat([m.weight.detach() for m in linears], dim=0).contiguous()
    row = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(merged[row : row + n], requires_grad=False)
        row += n
    return merged


def _weight(module: Any) -> Weight:
    """A Linear's or Embedding's weight as the kernels take it (int4: (packed, scale))."""
    if isinstance(module, int4.Int4Linear | int4.Int4Embedding):
        return module.int4
    return module.weight.detach()


def _embedding(tokens: torch.Tensor, table: Weight) -> torch.Tensor:
    if isinstance(table, tuple):
        return int4.embedding(tokens, *table)
    return F.embedding(tokens, table)


@dataclass(frozen=True)
class Gemma4Layer:
    """One decoder layer's weights and constants, in the form `gemma4_layer` takes."""

    index: int
    layer_type: str
    heads: int
    kv_heads: int
    head_dim: int
    window: int | None
    writes_kv: bool  # False: reads the KV of the last layer of its type that stores it
    kv_source: int  # the layer whose pools it reads
    w_qkv: Weight  # (heads*D [+ 2*kv_heads*D], hidden)
    w_o: Weight
    w_gate_up: Weight  # (2*I, hidden)
    w_down: Weight
    w_ple_gate: Weight  # (P, hidden)
    w_ple_proj: Weight  # (hidden, P)
    norms: tuple[torch.Tensor, ...]  # input, q, k, post_attn, pre_ff, post_ff, post_ple
    layer_scalar: torch.Tensor
    scale: float


def gemma4_layer(
    x: torch.Tensor,
    ple: torch.Tensor,
    weights: tuple[Weight, ...],
    norms: tuple[torch.Tensor, ...],
    layer_scalar: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    hidden: torch.Tensor,
    slot_index: torch.Tensor,
    positions: torch.Tensor,
    heads: int,
    head_dim: int,
    writes_kv: bool,
    scale: float,
    eps: float,
    activation: str,
    fused_gemv: bool = False,
    attention_form: str = "matmul",
    gemv_epilogues: bool = False,
) -> torch.Tensor:
    """One Gemma 4 decoder layer for a batch of single tokens: x (rows, hidden) ->
    (rows, hidden). Pure function of its arguments (what torch.compile caches per kind).

    `fused_gemv`: batch-1 projections through `kernels`, with what precedes them fused
    in: the input norms of q/k/v and gate/up, the GELU gates of down and the per-layer
    projection, and the feed-forward residual step of the per-layer gate. (Fusing the
    other residual steps too is slower: every program of a wide projection then rebuilds
    the residual row before it streams weights.)
    `gemv_epilogues`: the norms scale the products after them and the GELU gates end the
    projections that make them (gate/up, the per-layer gate) instead of starting the
    ones that read them, so no projection does a pass over its input before its weights
    stream, and the residual steps after the attention output and the per-layer
    projection end those products (see `kernels`).
    `attention_form`: "kernel" runs batch 1 on CUDA through `attention_kernel` and
    anything else through the products; "normed-kernel" also makes the q/k norms, rotary
    and the KV write part of that kernel (`decode_attention_normed`); "reduction" see
    `_attend`.
    """
    w_qkv, w_o, w_gate_up, w_down, w_ple_gate, w_ple_proj = weights
    n_in, n_q, n_k, n_post_attn, n_pre_ff, n_post_ff, n_post_ple = norms
    rows, width = x.shape

    qkv = kernels.norm_linear(x, n_in, eps, w_qkv, fused_gemv, post_scale=gemv_epilogues)
    if attention_form == "normed-kernel" and attention_kernel.use_normed_kernel(
        qkv, k_pool, v_pool
    ):
        attn = attention_kernel.decode_attention_normed(
            qkv, n_q, n_k, cos, sin, positions, k_pool, v_pool, hidden, heads, writes_kv, scale,
            eps,
        )  # fmt: skip
    else:
        attn = _normed_attention(
            qkv, n_q, n_k, k_pool, v_pool, cos, sin, hidden, slot_index, positions, heads,
            head_dim, writes_kv, scale, eps, attention_form,
        )  # fmt: skip
    attn = attn.reshape(rows, -1)
    if gemv_epilogues and activation == "gelu_pytorch_tanh":
        x = kernels.linear_residual(attn, w_o, x, n_post_attn, None, eps, fused_gemv)
        act = kernels.gated_norm_linear(x, n_pre_ff, eps, w_gate_up, fused_gemv, post_scale=True)
        d = kernels.linear(act, w_down, fused_gemv)
        ple_act, x = kernels.residual_linear(
            x, d, n_post_ff, None, None, eps, w_ple_gate, fused_gemv, gate_times=ple
        )
        return kernels.linear_residual(
            ple_act, w_ple_proj, x, n_post_ple, layer_scalar, eps, fused_gemv
        )
    if gemv_epilogues:
        x = kernels.linear_residual(attn, w_o, x, n_post_attn, None, eps, fused_gemv)
    else:
        o = kernels.linear(attn, w_o, fused_gemv)
        x = x + torch.rms_norm(o, (width,), n_post_attn, eps)
    gate, up = kernels.norm_linear(x, n_pre_ff, eps, w_gate_up, fused_gemv).chunk(2, dim=-1)
    d = _gated_linear(gate, up, w_down, activation, fused_gemv)
    ple_gate, x = kernels.residual_linear(x, d, n_post_ff, None, None, eps, w_ple_gate, fused_gemv)
    p = _gated_linear(ple_gate, ple, w_ple_proj, activation, fused_gemv)
    x = x + torch.rms_norm(p, (width,), n_post_ple, eps)
    return (x * layer_scalar).to(x.dtype)


def _normed_attention(
    qkv: torch.Tensor,
    n_q: torch.Tensor,
    n_k: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    hidden: torch.Tensor,
    slot_index: torch.Tensor,
    positions: torch.Tensor,
    heads: int,
    head_dim: int,
    writes_kv: bool,
    scale: float,
    eps: float,
    attention_form: str,
) -> torch.Tensor:
    """The layer's attention from its q/k/v row in torch operations: the q/k norms and
    rotary, the new key and value written to the pools, then `_attend` (or the batch-1
    kernel on CUDA, for both kernel forms): (rows, KVH, G, Dv)."""
    rows = qkv.shape[0]
    kv_heads, kv_len = k_pool.shape[1], hidden.shape[-1]
    q = qkv[:, : heads * head_dim].view(rows, heads, head_dim)
    q = _rotate(torch.rms_norm(q, (head_dim,), n_q, eps), cos, sin)
    if writes_kv:
        kv = qkv[:, heads * head_dim :].view(rows, 2, kv_heads, head_dim)
        k = _rotate(torch.rms_norm(kv[:, 0], (head_dim,), n_k, eps), cos, sin)
        v = torch.rms_norm(kv[:, 1], (head_dim,), None, eps)
        k_pool[slot_index, :, positions] = k
        v_pool[slot_index, :, positions] = v
    keys = k_pool[:rows, :, :kv_len]  # (rows, KVH, kv_len, D): slot b is row b
    values = v_pool[:rows, :, :kv_len]
    q = q.view(rows, kv_heads, heads // kv_heads, head_dim)
    if attention_form.endswith("kernel") and attention_kernel.use_kernel(q, k_pool):
        return attention_kernel.decode_attention(q, k_pool, v_pool, hidden, scale)
    return _attend(q, keys, values, hidden, scale, attention_form == "reduction")


def _gated_linear(
    a: torch.Tensor, b: torch.Tensor, weight: Weight, activation: str, fused_gemv: bool
) -> torch.Tensor:
    """act(a) * b @ weight^T, the GELU case fused into the product at batch 1."""
    if activation == "gelu_pytorch_tanh":
        return kernels.gelu_mul_linear(a, b, weight, fused_gemv)
    return kernels.linear(ACTIVATIONS[activation](a) * b, weight, False)


def _attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    hidden: torch.Tensor,
    scale: float,
    by_reduction: bool,
) -> torch.Tensor:
    """q (rows, KVH, G, D) over keys/values (rows, KVH, L, D) -> (rows, KVH, G, Dv).

    As matrix products (cuBLAS; the eager form), or, `by_reduction`, as broadcast
    products summed, which torch.compile turns into a couple of fused reductions instead
    of two small batched GEMMs and a softmax (never run eagerly: the broadcast would be
    materialised). Scores round to the activation dtype either way, as in transformers.
    """
    if by_reduction:
        scores = (q[:, :, :, None, :].float() * keys[:, :, None].float()).sum(-1)
        scores = scores.to(q.dtype)
    else:
        scores = torch.matmul(q, keys.transpose(-1, -2))
    if scale != 1.0:
        scores = scores * scale
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    if by_reduction:
        out = (probs[..., None].float() * values[:, :, None].float()).sum(-2)
        return out.to(values.dtype)
    return torch.matmul(probs, values)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotary: x * cos + rotate_half(x) * sin; cos/sin (rows, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def gemma4_embed(
    tokens: torch.Tensor,
    embed: Weight,
    embed_scale: torch.Tensor,
    ple_embed: Weight,
    ple_embed_scale: torch.Tensor,
    w_ple_model: Weight,
    ple_model_scale: float,
    ple_norm: torch.Tensor,
    ple_input_scale: float,
    layers: int,
    ple_width: int,
    eps: float,
    *,
    fused_gemv: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token's embedding and its per-layer inputs: (rows, hidden), (rows, layers, P)."""
    x = _embedding(tokens, embed) * embed_scale
    ple_tokens = (_embedding(tokens, ple_embed) * ple_embed_scale).view(-1, layers, ple_width)
    proj = kernels.linear(x, w_ple_model, fused_gemv) * ple_model_scale
    proj = torch.rms_norm(proj.view(-1, layers, ple_width), (ple_width,), ple_norm, eps)
    return x, (proj + ple_tokens) * ple_input_scale


def gemma4_step_inputs(
    tokens: torch.Tensor,
    positions: torch.Tensor,
    embedding: tuple[Any, ...],
    rotary_tables: tuple[tuple[torch.Tensor, torch.Tensor], ...],
    kv_len: int,
    windows: tuple[int | None, ...],
    fused_gemv: bool,
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    tuple[tuple[torch.Tensor, torch.Tensor], ...],
    tuple[torch.Tensor, ...],
]:
    """What every layer of a step reads: the embedding and per-layer inputs
    (`gemma4_embed`, `embedding` its arguments after the tokens), each layer type's
    rotary rows at the positions, and each window's mask. One function, so that a
    compiled step builds them in a few fused kernels rather than a launch apiece."""
    x, ple = gemma4_embed(tokens, *embedding, fused_gemv=fused_gemv)
    rows = tuple((cos[positions], sin[positions]) for cos, sin in rotary_tables)
    masks = tuple(hidden_keys(positions, kv_len, window) for window in windows)
    return x, ple, rows, masks


def gemma4_head(
    x: torch.Tensor,
    norm: torch.Tensor,
    lm_head: Weight,
    softcap: float | None,
    eps: float,
    fused_gemv: bool = False,
    post_scale: bool = False,
) -> torch.Tensor:
    logits = kernels.norm_linear(x, norm, eps, lm_head, fused_gemv, post_scale=post_scale)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


@dataclass(frozen=True)
class ProgramOptions:
    """How a decode program runs: `compile_mode` (a torch.compile mode, or None for
    eager) for each kind of layer; `triton_gemv`: batch-1 projections through `kernels`;
    `attention_form`: "matmul" or "reduction" (see `_attend`; only when compiled), or
    "kernel" (`attention_kernel` at batch 1, the products otherwise), or "normed-kernel"
    (the same with the q/k norms, rotary and KV write in the kernel); `gemv_epilogues`:
    see `gemma4_layer` (with `triton_gemv`)."""

    compile_mode: str | None = None
    triton_gemv: bool = False
    attention_form: str = "matmul"
    gemv_epilogues: bool = True
    compile_backend: str = "inductor"  # aot_eager: traced as in serving, no code generated


class Gemma4DecodeProgram:
    """The batched decode step of a `Gemma4ForCausalLM` (text) over the engine's pools."""

    def __init__(
        self,
        model: nn.Module,
        cache: SlotKVCache,
        max_len: int,
        options: ProgramOptions,
    ) -> None:
        # Any: torch types a submodule reached by attribute as `Tensor | Module`; these are
        # transformers' Gemma 4 modules, checked by _check_supported and the tests.
        hf: Any = model
        config = hf.config.get_text_config()
        compile_layers = options.compile_mode is not None
        # Gemma4ForCausalLM holds the text decoder as `.model`; the multimodal
        # Gemma4ForConditionalGeneration (what AutoModelForCausalLM loads for the hub's
        # gemma-4 checkpoints) as `.model.language_model`, beside the vision and audio
        # towers, which decode never uses.
        text = getattr(hf.model, "language_model", hf.model)
        self._check_supported(config, text)
        embed = text.embed_tokens
        table = embed.scale if isinstance(embed, int4.Int4Embedding) else embed.weight
        dtype, device = table.dtype, table.device
        self.eps = float(config.rms_norm_eps)
        self.activation = str(config.hidden_activation)
        if self.activation not in ACTIVATIONS:
            raise UnsupportedModel(f"activation {self.activation!r}")
        self.softcap = config.final_logit_softcapping
        self.num_layers = config.num_hidden_layers
        self.ple_width = config.hidden_size_per_layer_input
        self.embed = _weight(text.embed_tokens)
        self.embed_scale = text.embed_tokens.embed_scale.to(dtype)
        self.ple_embed = _weight(text.embed_tokens_per_layer)
        self.ple_embed_scale = text.embed_tokens_per_layer.embed_scale.to(dtype)
        self.w_ple_model = _weight(text.per_layer_model_projection)
        self.ple_model_scale = float(text.per_layer_model_projection_scale)
        self.ple_norm = text.per_layer_projection_norm.weight
        self.ple_input_scale = float(text.per_layer_input_scale)
        self.final_norm = text.norm.weight
        self.lm_head = _weight(hf.lm_head)
        # Rotary tables by layer type, from the model's own rotary module over every
        # position, so a step gathers rows instead of computing cos/sin.
        positions = torch.arange(max_len, device=device)[None, :]
        probe = torch.zeros(1, dtype=dtype, device=device)
        self.rotary: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        with torch.no_grad():
            for layer_type in sorted(set(config.layer_types)):
                cos, sin = text.rotary_emb(probe, positions, layer_type)
                self.rotary[layer_type] = (cos[0].contiguous(), sin[0].contiguous())
        self.layers = [self._layer(i, text, config) for i in range(len(text.layers))]
        self.windows = tuple(dict.fromkeys(layer.window for layer in self.layers))
        for layer in self.layers:
            if layer.writes_kv:
                cache.allocate(layer.index, layer.kv_heads, layer.head_dim, dtype)
        self.cache = cache
        self._layer_fn: Callable[..., torch.Tensor] = gemma4_layer
        self._inputs_fn: Callable[..., Any] = gemma4_step_inputs
        self._head_fn: Callable[..., torch.Tensor] = gemma4_head
        # Batch-1 projections through the Triton matrix-vector kernels (`kernels`);
        # larger batches keep cuBLAS (the kernels fall back by themselves).
        self.fused_gemv = options.triton_gemv
        self.gemv_epilogues = options.triton_gemv and options.gemv_epilogues
        # The reduction form of attention only makes sense compiled (see `_attend`), and
        # even then it loses to the products at large batches (benchmarks/records/).
        self.attention_form = options.attention_form
        if options.attention_form == "reduction" and not compile_layers:
            self.attention_form = "matmul"
        if self.attention_form not in ATTENTION_FORMS:
            raise ValueError(f"unknown attention form {options.attention_form!r}")
        if compile_layers:
            # Layers of one kind share shapes and constants, so they share one compiled
            # graph; batch size and KV length become dynamic after their first change.
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            kw: dict[str, Any] = {"fullgraph": True, "backend": options.compile_backend}
            if options.compile_backend == "inductor":  # modes are Inductor's
                kw["mode"] = options.compile_mode
            self._layer_fn = torch.compile(gemma4_layer, **kw)
            self._inputs_fn = torch.compile(gemma4_step_inputs, **kw)
            self._head_fn = torch.compile(gemma4_head, **kw)
        log.info(
            "decode program: Gemma 4, %d layers (%d write KV), merged q/k/v and gate/up%s%s%s",
            len(self.layers),
            sum(layer.writes_kv for layer in self.layers),
            ", layers compiled" if compile_layers else "",
            (", Triton GEMV at batch 1" + (" with epilogues" if self.gemv_epilogues else ""))
            if self.fused_gemv
            else "",
            f", attention: {self.attention_form}",
        )

    @staticmethod
    def _check_supported(config: object, text: Any) -> None:
        problems = []
        if getattr(config, "enable_moe_block", False):
            problems.append("mixture-of-experts blocks")
        if getattr(config, "attention_k_eq_v", False):
            problems.append("attention_k_eq_v")
        if getattr(config, "attention_bias", False):
            problems.append("attention biases")
        if not getattr(config, "hidden_size_per_layer_input", 0):
            problems.append("no per-layer embeddings")
        if getattr(config, "use_bidirectional_attention", None) == "all":
            problems.append("bidirectional attention")
        if problems:
            raise UnsupportedModel(", ".join(problems))

    @staticmethod
    def _layer(index: int, text: Any, config: Any) -> Gemma4Layer:
        layer = text.layers[index]
        attn = layer.self_attn
        mlp = layer.mlp
        head_dim = attn.head_dim
        heads = attn.q_proj.out_features // head_dim
        w_qkv: Weight
        if attn.is_kv_shared_layer:
            w_qkv = _weight(attn.q_proj)
            kv_source = _kv_producer(config, index)
            kv_heads = text.layers[kv_source].self_attn.k_proj.out_features // head_dim
            k_norm = attn.q_norm.weight  # unused: the layer writes no keys
        else:
            w_qkv = _merge_linears([attn.q_proj, attn.k_proj, attn.v_proj])
            kv_source = index
            kv_heads = attn.k_proj.out_features // head_dim
            k_norm = attn.k_norm.weight
        return Gemma4Layer(
            index=index,
            layer_type=attn.layer_type,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            window=attn.sliding_window,
            writes_kv=not attn.is_kv_shared_layer,
            kv_source=kv_source,
            w_qkv=w_qkv,
            w_o=_weight(attn.o_proj),
            w_gate_up=_merge_linears([mlp.gate_proj, mlp.up_proj]),
            w_down=_weight(mlp.down_proj),
            w_ple_gate=_weight(layer.per_layer_input_gate),
            w_ple_proj=_weight(layer.per_layer_projection),
            norms=(
                layer.input_layernorm.weight,
                attn.q_norm.weight,
                k_norm,
                layer.post_attention_layernorm.weight,
                layer.pre_feedforward_layernorm.weight,
                layer.post_feedforward_layernorm.weight,
                layer.post_per_layer_input_norm.weight,
            ),
            layer_scalar=layer.layer_scalar,
            scale=float(attn.scaling),
        )

    def step(
        self, tokens: torch.Tensor, positions: torch.Tensor, slot_index: torch.Tensor, kv_len: int
    ) -> torch.Tensor:
        """One token per row (row b in slot b; padding rows write into a scratch slot):
        logits (rows, vocab) in the model's dtype."""
        embedding = (
            self.embed,
            self.embed_scale,
            self.ple_embed,
            self.ple_embed_scale,
            self.w_ple_model,
            self.ple_model_scale,
            self.ple_norm,
            self.ple_input_scale,
            self.num_layers,
            self.ple_width,
            self.eps,
        )
        # The masks by window from the generic batched step's rule (`hidden_keys`), once a
        # step, with the embedding and the rotary rows.
        x, ple, rows, masks = self._inputs_fn(
            tokens, positions, embedding, tuple(self.rotary.values()), kv_len, self.windows,
            self.fused_gemv,
        )  # fmt: skip
        rotary = dict(zip(self.rotary, rows, strict=True))
        hidden = dict(zip(self.windows, masks, strict=True))
        for layer in self.layers:
            cos, sin = rotary[layer.layer_type]
            x = self._layer_fn(
                x,
                ple[:, layer.index],
                (
                    layer.w_qkv,
                    layer.w_o,
                    layer.w_gate_up,
                    layer.w_down,
                    layer.w_ple_gate,
                    layer.w_ple_proj,
                ),
                layer.norms,
                layer.layer_scalar,
                self.cache.keys[layer.kv_source],
                self.cache.values[layer.kv_source],
                cos,
                sin,
                hidden[layer.window],
                slot_index,
                positions,
                layer.heads,
                layer.head_dim,
                layer.writes_kv,
                layer.scale,
                self.eps,
                self.activation,
                self.fused_gemv,
                self.attention_form,
                self.gemv_epilogues,
            )
        return self._head_fn(
            x,
            self.final_norm,
            self.lm_head,
            self.softcap,
            self.eps,
            self.fused_gemv,
            self.gemv_epilogues,
        )


def _kv_producer(config: Any, index: int) -> int:
    """The layer whose K/V a KV-sharing layer reads: the last layer of its type that
    stores them (transformers' `kv_sharing_modes`)."""
    modes = config.kv_sharing_modes
    layer_type = config.layer_types[index]
    for i in range(index - 1, -1, -1):
        if modes[i] == "store" and config.layer_types[i] == layer_type:
            return i
    raise UnsupportedModel(f"layer {index} shares KV but no earlier {layer_type} layer stores it")


PROGRAMS: dict[str, type[Gemma4DecodeProgram]] = {
    "Gemma4ForCausalLM": Gemma4DecodeProgram,
    "Gemma4ForConditionalGeneration": Gemma4DecodeProgram,
}


def program_for(
    model: nn.Module, cache: SlotKVCache, max_len: int, options: ProgramOptions | None = None
) -> Gemma4DecodeProgram | None:
    """The model's decode program, or None (with the reason logged) for the generic step."""
    cls = PROGRAMS.get(type(model).__name__)
    if cls is None:
        log.info("no decode program for %s: generic decode step", type(model).__name__)
        return None
    try:
        return cls(model, cache, max_len, options or ProgramOptions())
    except UnsupportedModel as exc:
        log.info("decode program for %s not used (%s): generic step", type(model).__name__, exc)
        return None
