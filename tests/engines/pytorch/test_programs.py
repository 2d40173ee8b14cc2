"""The Gemma 4 decode program against transformers' own forward: same logits and the same
K/V written, on the same pools, for a batch of sequences at different lengths."""

from __future__ import annotations

import pytest
import torch

from engines.pytorch import kernels
from engines.pytorch.graphs import POSITIONS, SLOTS, TOKENS, pad_step
from engines.pytorch.model import LoadedModel, load_model
from engines.pytorch.programs import Gemma4DecodeProgram, ProgramOptions, program_for
from engines.pytorch.runner import ModelRunner


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_model("random:tiny-gemma4", device="cpu", seed=0)


def _runner(loaded: LoadedModel, slots: int) -> ModelRunner:
    return ModelRunner(
        loaded,
        num_slots=slots,
        batch_invariant=False,
        batched_decode=True,
        packed_prefill=True,
        decode_program=True,
    )


def _load_step(runner: ModelRunner, tokens: list[int], positions: list[int]) -> tuple[int, int]:
    """Fill the static decode inputs for rows in slots 0 ... n - 1; (bucket, kv_len)."""
    step = pad_step(
        list(range(len(tokens))),
        tokens,
        positions,
        buckets=runner.buckets,
        capacity=runner.cache.capacity,
        scratch_slot=runner.cache.scratch_slot,
    )
    runner.step_inputs[:, : step.bucket].copy_(step.host)
    return step.bucket, step.kv_len


def test_program_logits_and_cache_writes_match_transformers(loaded: LoadedModel) -> None:
    runner = _runner(loaded, 4)
    assert isinstance(runner.program, Gemma4DecodeProgram)
    # Lengths past the toy model's 16-token window, so sliding masks matter.
    prompts = [
        [257, *[(7 * i + 3 * j) % 90 + 33 for j in range(n)]] for i, n in enumerate([5, 20, 37])
    ]
    for slot, ids in enumerate(prompts):
        runner.prefill(slot, ids)
    bucket, kv_len = _load_step(runner, [40, 41, 42], [len(p) for p in prompts])
    program = runner.program
    with torch.inference_mode():
        runner.program = None
        expected = runner._static_step(bucket, kv_len)[:3]
        keys_expected = {i: k.clone() for i, k in runner.cache.keys.items()}
        for pool in (*runner.cache.keys.values(), *runner.cache.values.values()):
            for slot, ids in enumerate(prompts):
                pool[slot, :, len(ids)] = 0  # the program must write them again
        runner.program = program
        got = runner._static_step(bucket, kv_len)[:3]
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    for layer, pool in runner.cache.keys.items():
        assert torch.allclose(pool[:3], keys_expected[layer][:3], atol=1e-5), layer


def test_program_merges_projections_without_copying(loaded: LoadedModel) -> None:
    runner = _runner(loaded, 2)
    attn = loaded.model.model.layers[0].self_attn
    layer = runner.program.layers[0]
    assert attn.q_proj.weight.data_ptr() == layer.w_qkv.data_ptr()
    storage = layer.w_qkv.untyped_storage().data_ptr()
    assert attn.k_proj.weight.untyped_storage().data_ptr() == storage
    # KV-sharing layers own no pools: they read their producer's.
    shared = [layer for layer in runner.program.layers if not layer.writes_kv]
    assert shared
    assert all(layer.index not in runner.cache.keys for layer in shared)
    assert all(layer.kv_source in runner.cache.keys for layer in shared)


def test_llama_model_keeps_the_generic_step() -> None:
    llama = load_model("random:tiny", device="cpu", seed=0)
    runner = _runner(llama, 2)
    assert runner.program is None
    assert program_for(llama.model, runner.cache, 64) is None
    # the server's automatic compile is for programs: without one the step stays eager
    auto = ModelRunner(
        llama,
        num_slots=2,
        batch_invariant=False,
        batched_decode=True,
        decode_program=True,
        compile_mode="default",
        compile_without_program=False,
    )
    assert auto.program is None and auto._step_fn == auto._static_step


def test_program_step_reads_the_static_buffers(loaded: LoadedModel) -> None:
    runner = _runner(loaded, 2)
    runner.prefill(0, [257, 40, 41, 42])
    with torch.inference_mode():
        runner.step_inputs[TOKENS, 0] = 43
        runner.step_inputs[POSITIONS, 0] = 4
        runner.step_inputs[SLOTS, 0] = 0
        a = runner._static_step(1, 256).clone()
        b = runner.decode([0], [43], [4])
    assert torch.allclose(a, b)


def test_attention_by_reduction_matches_the_matrix_products(loaded: LoadedModel) -> None:
    runner = _runner(loaded, 2)
    runner.prefill(0, [257, *range(40, 70)])
    runner.prefill(1, [257, *range(50, 55)])
    with torch.inference_mode():
        bucket, kv_len = _load_step(runner, [70, 55], [31, 6])
        by_products = runner._static_step(bucket, kv_len).clone()
        runner.program.attention_form = "reduction"
        by_reduction = runner._static_step(bucket, kv_len)
    assert torch.allclose(by_reduction, by_products, atol=1e-4, rtol=1e-4)


def test_batch1_kernel_wrappers_fall_back_to_torch_off_cuda() -> None:
    gen = torch.Generator().manual_seed(0)
    x, b = torch.randn(1, 64, generator=gen), torch.randn(1, 64, generator=gen)
    w, nw = torch.randn(32, 64, generator=gen), torch.randn(64, generator=gen)
    assert torch.equal(kernels.linear(x, w), x @ w.T)
    assert torch.equal(
        kernels.norm_linear(x, nw, 1e-6, w, True),
        torch.rms_norm(x, (64,), nw, 1e-6) @ w.T,
    )
    gated = torch.nn.functional.gelu(x, approximate="tanh") * b
    assert torch.allclose(kernels.gelu_mul_linear(x, b, w, True), gated @ w.T)
    gate, up = (torch.rms_norm(x, (64,), nw, 1e-6) @ w.T).chunk(2, dim=-1)
    assert torch.equal(
        kernels.gated_norm_linear(x, nw, 1e-6, w, True, post_scale=True),
        torch.nn.functional.gelu(gate, approximate="tanh") * up,
    )
    m = torch.randn(1, 32, generator=gen)
    y, x_new = kernels.residual_linear(x, b, nw, None, None, 1e-6, w, True, gate_times=m)
    assert torch.equal(x_new, x + torch.rms_norm(b, (64,), nw, 1e-6))
    assert torch.equal(y, torch.nn.functional.gelu(x_new @ w.T, approximate="tanh") * m)


def test_each_kind_of_layer_traces_as_one_graph(loaded: LoadedModel) -> None:
    """What serving compiles on CUDA, traced here without code generation (aot_eager):
    no graph breaks (fullgraph), the same logits as eager, and one compiled graph per
    kind of layer, shared by the layers of that kind."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager = _runner(loaded, 2)
    compiled = ModelRunner(
        loaded,
        num_slots=2,
        batch_invariant=False,
        batched_decode=True,
        packed_prefill=True,
        decode_program=True,
    )
    compiled.program = Gemma4DecodeProgram(
        loaded.model,
        compiled.cache,
        loaded.max_model_len,
        ProgramOptions(compile_mode="default", compile_backend="aot_eager"),
    )
    outs = []
    for runner in (eager, compiled):
        runner.prefill(0, [257, *range(40, 60)])
        runner.prefill(1, [257, *range(70, 75)])
        with torch.inference_mode():
            outs.append(runner.decode([0, 1], [60, 75], [21, 6]).clone())
    assert torch.allclose(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    kinds = {(layer.layer_type, layer.writes_kv) for layer in compiled.program.layers}
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert frames == len(kinds) + 2  # + the step's inputs and the head


def test_a_cleared_slot_passes_no_nan_to_its_next_owner(loaded: LoadedModel) -> None:
    """Masked keys get probability 0, but 0 x NaN is NaN: a slot left with non-finite
    K/V by its last owner poisons the next one's decode unless it is cleared."""
    runner = _runner(loaded, 2)
    with torch.inference_mode():
        for pool in (*runner.cache.keys.values(), *runner.cache.values.values()):
            pool[0, :, 100:] = float("nan")  # left by an earlier owner, past the new prompt
        runner.prefill(0, [257, 40, 41, 42])
        poisoned = runner.decode([0], [43], [4])
        assert not torch.isfinite(poisoned[0][runner.banned_ids.logical_not()]).all()
        runner.clear_slot(0)
        runner.prefill(0, [257, 40, 41, 42])
        clean = runner.decode([0], [43], [4])
    assert torch.isfinite(clean[0][runner.banned_ids.logical_not()]).all()


def test_multimodal_gemma4_class_gets_the_program_on_its_text_decoder() -> None:
    """The hub's gemma-4 checkpoints load as Gemma4ForConditionalGeneration (text decoder
    under `.model.language_model`); the program serves its text decode the same way."""
    from transformers import AutoModelForCausalLM, Gemma4Config

    from engines.pytorch.model import RANDOM_MODELS
    from engines.serving.tokenizer import build_byte_tokenizer, generation_ids

    tok = build_byte_tokenizer()
    text_config = RANDOM_MODELS["tiny-gemma4"].build_config(tok)
    config = Gemma4Config(text_config=text_config.to_dict(), vision_config=None, audio_config=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert type(model).__name__ == "Gemma4ForConditionalGeneration"
    multimodal = LoadedModel(
        "mm", model, tok, torch.device("cpu"), torch.float32, 256, [1], generation_ids(tok)
    )
    runner = _runner(multimodal, 2)
    assert isinstance(runner.program, Gemma4DecodeProgram)
    runner.prefill(0, [257, *range(40, 60)])
    runner.prefill(1, [257, *range(70, 75)])
    with torch.inference_mode():
        bucket, kv_len = _load_step(runner, [60, 75], [21, 6])
        program = runner.program
        runner.program = None
        expected = runner._static_step(bucket, kv_len).clone()
        runner.program = program
        got = runner._static_step(bucket, kv_len)
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_attention_kernel_form_keeps_the_products_off_cuda(loaded: LoadedModel) -> None:
    runner = _runner(loaded, 2)
    runner.prefill(0, [257, *range(40, 70)])
    with torch.inference_mode():
        bucket, kv_len = _load_step(runner, [70], [31])
        by_products = runner._static_step(bucket, kv_len).clone()
        runner.program.attention_form = "kernel"
        assert torch.equal(runner._static_step(bucket, kv_len), by_products)
