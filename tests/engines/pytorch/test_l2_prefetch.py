"""Each layer of the Gemma 4 decode program asks L2 for its int4 weights (`l2_prefetch`):
the ranges it asks for (where they start, how much, aligned), where in the layer it asks,
and that asking changes no logit, eager and traced for compilation. A CPU has no L2 to
ask, so the op only passes the activations through here; its kernel is checked by
Triton's interpreter (`test_triton_interpreter`), by the sm_90 build
(`test_triton_sm90_build`) and on the H200 (`test_int4_cuda`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engines.pytorch import checkpoint, int4, l2_prefetch
from engines.pytorch.config import parse_args
from engines.pytorch.model import load_model
from engines.pytorch.programs import Gemma4DecodeProgram, ProgramOptions
from engines.pytorch.runner import ModelRunner

GROUP = 8


def _int4_model() -> Any:
    loaded = load_model("random:tiny-gemma4", device="cpu")
    checkpoint.quantize_model(loaded.model, GROUP, int4_modules=True)
    return loaded


def _bytes(ranges: tuple[torch.Tensor, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ranges)


@pytest.mark.parametrize(("place", "first"), [("layer", "q_proj"), ("attention", "o_proj")])
def test_a_layer_asks_for_its_block_from_the_first_product_after_the_place(
    place: str, first: str
) -> None:
    loaded = _int4_model()
    attn = loaded.model.get_decoder().layers[0].self_attn
    module = getattr(attn, first)
    block = module.block
    assert block is not None
    ranges = l2_prefetch.layer_ranges(module, budget_mb=100.0)
    assert ranges is not None
    words, scales = ranges
    # Views of the block from the module's first value on, to the block's end.
    assert words.data_ptr() == block.packed.data_ptr() + module.offset // int4.PER_WORD * 4
    scale_bytes = scales.element_size()
    assert scales.data_ptr() == block.scale.data_ptr() + module.offset // GROUP * scale_bytes
    values = words.numel() * int4.PER_WORD
    assert module.offset + values == block.packed.numel() * int4.PER_WORD
    assert values // GROUP == scales.numel()
    # A budget cuts at a whole row of the block (16-byte aligned words and scales).
    budget_mb = _bytes(ranges) / 2 / 1e6
    words, scales = l2_prefetch.layer_ranges(module, budget_mb) or (words, scales)
    assert 0 < _bytes((words, scales)) <= budget_mb * 1e6
    assert words.numel() * int4.PER_WORD % block.row == 0
    assert words.numel() * 4 % 16 == 0 and scales.numel() * scales.element_size() % 16 == 0
    assert l2_prefetch.layer_ranges(module, 0.0) is None
    assert l2_prefetch.layer_ranges(torch.nn.Linear(8, 8), 100.0) is None  # not int4


def test_the_program_asks_where_told_and_its_logits_do_not_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded = _int4_model()
    prompts = {0: [257, *range(40, 70)], 1: [257, *range(70, 75)]}
    asked: list[tuple[tuple[int, ...], int]] = []
    passed = l2_prefetch.prefetch

    def recording(x: torch.Tensor, ranges: Any) -> torch.Tensor:
        asked.append((tuple(x.shape), ranges[0].data_ptr()))
        return passed(x, ranges)

    monkeypatch.setattr(l2_prefetch, "supported", lambda device: True)
    monkeypatch.setattr(l2_prefetch, "prefetch", recording)
    layers = loaded.model.get_decoder().layers
    outs = {}
    for place, compile_mode in (("off", None), ("layer", None), ("attention", None),
                                ("layer", "default")):  # fmt: skip
        runner = ModelRunner(
            loaded, num_slots=2, batch_invariant=False, batched_decode=True, decode_program=True
        )
        torch._dynamo.reset()
        options = ProgramOptions(
            compile_mode=compile_mode, compile_backend="aot_eager", l2_prefetch=place
        )
        runner.program = program = Gemma4DecodeProgram(
            loaded.model, runner.cache, loaded.max_model_len, options
        )
        assert program.l2_place == place
        for slot, prompt in prompts.items():
            runner.prefill(slot, prompt)
        asked.clear()
        with torch.inference_mode():
            outs[place, compile_mode] = runner.decode([0, 1], [60, 75], [31, 6]).clone()
        if place == "off":
            assert not asked
            continue
        if compile_mode is not None:  # traced: asked while the graph was built
            assert asked
            continue
        first = "q_proj" if place == "layer" else "o_proj"
        hidden = loaded.model.config.get_text_config().hidden_size
        starts = [getattr(layer.self_attn, first).block.packed.data_ptr() for layer in layers]
        assert len(asked) == len(layers)
        for (shape, start), layer, block_start in zip(asked, layers, starts, strict=True):
            module = getattr(layer.self_attn, first)
            assert start == block_start + module.offset // int4.PER_WORD * 4
            assert shape[0] == 2 and (shape[-1] == hidden) == (place == "layer")
    for key, out in outs.items():
        torch.testing.assert_close(out, outs["off", None], rtol=0, atol=0, msg=str(key))


def test_the_cpu_asks_for_nothing_and_the_place_is_checked() -> None:
    loaded = _int4_model()
    runner = ModelRunner(
        loaded, num_slots=2, batch_invariant=False, batched_decode=True, decode_program=True,
        l2_prefetch="layer",
    )  # fmt: skip
    assert runner.program is not None and runner.program.l2_place == "off"
    assert all(layer.l2_ranges is None for layer in runner.program.layers)
    with pytest.raises(ValueError, match="L2 prefetch place"):
        Gemma4DecodeProgram(
            loaded.model, runner.cache, loaded.max_model_len, ProgramOptions(l2_prefetch="x")
        )


def test_the_engine_flags_reach_the_config() -> None:
    config = parse_args(["--int4-l2-prefetch", "attention", "--int4-l2-prefetch-mb", "16"])
    assert (config.int4_l2_prefetch, config.int4_l2_prefetch_mb) == ("attention", 16.0)
    assert parse_args([]).int4_l2_prefetch == "off"


HOPPER = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="needs a CUDA device of compute capability 9.0 or later",
)


@HOPPER
def test_the_op_passes_its_activations_through_on_the_gpu() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    words = torch.zeros(10_000_003, dtype=torch.int32, device="cuda")  # 40 MB, not whole pieces
    scales = torch.zeros(1_250_001, dtype=torch.bfloat16, device="cuda")
    for rows in (1, 64):
        x = torch.randn(rows, 1536, device="cuda", generator=gen).to(torch.bfloat16)
        assert torch.equal(l2_prefetch.prefetch(x, (words, scales)), x)


@HOPPER
@pytest.mark.parametrize("place", ["layer", "attention"])
def test_asking_l2_changes_no_logit_of_a_graphed_int4_step(place: str) -> None:
    prompt = [257, *range(40, 70)]  # past tiny-gemma4's 16-token sliding window

    def decode(place: str, rows: int) -> torch.Tensor:
        runner = ModelRunner(
            load_model("random:tiny-gemma4", device="cuda", seed=0, quantize="w4a16"),
            num_slots=2, batch_invariant=False, batched_decode=True, cuda_graphs=True,
            fused_norms=True, decode_program=True, triton_gemv=True, attention_form="kernel",
            l2_prefetch=place,
        )  # fmt: skip
        assert runner.program is not None and runner.program.l2_place == place
        for slot in range(rows):
            runner.prefill(slot, prompt)
        steps = [
            runner.decode(list(range(rows)), [60 + k] * rows, [len(prompt) + k] * rows).clone()
            for k in range(8)
        ]
        return torch.cat(steps)

    for rows in (1, 2):
        assert torch.equal(decode(place, rows), decode("off", rows)), rows
