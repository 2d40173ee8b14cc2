"""W4A16 weights on the CPU: the pack-quantized format against compressed-tensors itself
(packing, round-to-nearest scales, whole-checkpoint decompression), the engine's greedy
text on a library-written tiny Gemma 4 against transformers on the dequantized weights,
the quantize command's round trip, and one-line refusals of what the engine cannot serve."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.pack_quantized.helpers import (
    pack_to_int32,
    unpack_from_int32,
)
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.lifecycle.forward import quantize as ct_quantize
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.utils.quantization_config import CompressedTensorsConfig

from engines.pytorch import checkpoint, int4, int4_blocks, kernels
from engines.pytorch.model import build_random_model, load_model
from engines.pytorch.runner import ModelRunner

# tiny-gemma4's narrowest inputs are 8 wide (per-layer inputs), so its groups are 8.
GROUP = 8
NEW_TOKENS = 24


def _args(group: int) -> QuantizationArgs:
    return QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=group
    )


def _write_with_compressed_tensors(out: Path, group: int) -> None:
    """random:tiny-gemma4 in float32 as the library writes a W4A16 checkpoint: its scheme
    applied, its min/max scales, its compressor, its config entry."""
    model, tokenizer, _ = build_random_model(
        "tiny-gemma4", dtype=torch.float32, device=torch.device("cpu")
    )
    args = _args(group)
    scheme = QuantizationScheme(targets=["Linear", "Embedding"], weights=args)
    config = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized")
    apply_quantization_config(model, config)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "weight_scale"):
                w = module.weight.view(module.weight.shape[0], -1, group)
                scale, zero = calculate_qparams(w.amin(-1), w.amax(-1), args)
                module.weight_scale.copy_(scale)
                module.weight_zero_point.copy_(zero)
    compressor = ModelCompressor.from_pretrained_model(model, "pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
    tokenizer.save_pretrained(str(out))


@pytest.fixture(scope="module")
def ct_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("ct") / "tiny-gemma4-w4a16"
    _write_with_compressed_tensors(out, GROUP)
    return out


def _reference(folder: Path) -> torch.nn.Module:
    """transformers with compressed-tensors decompressing the checkpoint (float32)."""
    model = AutoModelForCausalLM.from_pretrained(
        str(folder),
        dtype=torch.float32,
        quantization_config=CompressedTensorsConfig(run_compressed=False),
    )
    return model.eval()


def test_packing_matches_compressed_tensors() -> None:
    gen = torch.Generator().manual_seed(0)
    for cols in (8, 64, 200, 1536):
        q = torch.randint(-8, 8, (5, cols), generator=gen, dtype=torch.int8)
        packed = int4.pack(q)
        assert torch.equal(packed, pack_to_int32(q, 4))
        assert torch.equal(int4.unpack(packed, cols), q)
        assert torch.equal(unpack_from_int32(packed, 4, torch.Size((5, cols))), q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [8, 32, 128])
def test_round_to_nearest_matches_compressed_tensors(dtype: torch.dtype, group: int) -> None:
    gen = torch.Generator().manual_seed(group)
    weight = (torch.randn(6, 256, generator=gen) * 0.05).to(dtype)
    weight[0, :group] = 0  # an all-zero group
    packed, scale = int4.quantize(weight, group)
    grouped = weight.view(6, -1, group)
    want_scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), _args(group))
    assert scale.dtype == dtype
    assert torch.equal(scale, want_scale.to(dtype))
    want_q = ct_quantize(weight, want_scale.to(dtype), zero, _args(group), dtype=torch.int8)
    assert torch.equal(int4.unpack(packed, 256), want_q)


@pytest.mark.parametrize("chunk_values", [1, 200, 1000])
def test_passes_by_rows_give_the_values_of_one_pass(
    chunk_values: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Row chunks bound the temporaries (`int4.CHUNK_VALUES`); rows are independent, so
    # chunks of one row, of a few rows and of a part of a row all give the same values.
    gen = torch.Generator().manual_seed(chunk_values)
    weight = (torch.randn(13, 256, generator=gen) * 0.05).to(torch.bfloat16)
    whole_packed, whole_scale = int4.quantize(weight, 32)
    whole_dense = int4.dequantize(whole_packed, whole_scale, torch.float32)
    monkeypatch.setattr(int4, "CHUNK_VALUES", chunk_values)
    packed, scale = int4.quantize(weight, 32)
    assert torch.equal(packed, whole_packed) and torch.equal(scale, whole_scale)
    assert torch.equal(int4.dequantize(packed, scale, torch.float32), whole_dense)
    q = int4.unpack(packed, 256)
    assert torch.equal(q, unpack_from_int32(whole_packed, 4, torch.Size((13, 256))))
    assert torch.equal(int4.pack(q), whole_packed)


def test_checkpoint_values_equal_the_librarys_decompression(ct_checkpoint: Path) -> None:
    loaded = load_model(str(ct_checkpoint), device="cpu")
    quant = loaded.quantization
    assert quant is not None and quant.group_sizes == (GROUP,)
    reference = _reference(ct_checkpoint)
    linears = sum(isinstance(m, torch.nn.Linear) for m in reference.modules())
    assert quant.summary()["modules"] == {"linear": linears, "embedding": 2}
    ours = dict(loaded.model.named_parameters())
    theirs = dict(reference.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name


def _prompts() -> list[list[int]]:
    # 20 to 41 tokens: past tiny-gemma4's 16-token sliding window.
    return [[257, *[(37 * i + 11 * j) % 250 + 1 for j in range(20 + 7 * i)]] for i in range(4)]


def _greedy(runner: ModelRunner, prompt: list[int]) -> list[int]:
    out = [int(runner.prefill(0, prompt).argmax())]
    for _ in range(NEW_TOKENS - 1):
        out.append(int(runner.decode([0], [out[-1]], [len(prompt) + len(out) - 1])[0].argmax()))
    return out


def test_greedy_text_equals_transformers_on_dequantized_weights(ct_checkpoint: Path) -> None:
    loaded = load_model(str(ct_checkpoint), device="cpu")
    runner = ModelRunner(loaded, num_slots=1, batch_invariant=True)
    reference = _reference(ct_checkpoint)
    for prompt in _prompts():
        ours = _greedy(runner, prompt)
        with torch.inference_mode():
            theirs = reference.generate(
                torch.tensor([prompt]),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
            )[0, len(prompt) :].tolist()
        assert ours == theirs, f"prompt of {len(prompt)} tokens"
    assert len({tuple(_greedy(runner, p)) for p in _prompts()}) > 1


def _with_int4_modules(folder: Path) -> torch.nn.Module:
    """The checkpoint's model in its CUDA form, on the CPU: each int4 tensor set installed
    as an int4 module, the tied head sharing the embedding's values."""
    model = load_model(str(folder), device="cpu").model
    tensors = load_file(str(folder / "model.safetensors"))
    for name in checkpoint._quantized_names(tensors):
        if name != "lm_head":
            packed, scale = tensors[f"{name}.weight_packed"], tensors[f"{name}.weight_scale"]
            int4.install(model, name, packed, scale)
    assert int4.tie_head(model)
    return model


def test_int4_modules_compute_what_the_dequantized_model_computes(ct_checkpoint: Path) -> None:
    """The CUDA form (int4 modules, tied head sharing the embedding's values) run on the
    CPU through transformers' forward: the same logits as the dense dequantized model."""
    dense = load_model(str(ct_checkpoint), device="cpu").model
    swapped = _with_int4_modules(ct_checkpoint)
    head = swapped.get_output_embeddings()
    assert isinstance(head, int4.Int4Linear)
    assert head.packed is swapped.get_input_embeddings().packed
    ids = torch.tensor([_prompts()[1]])
    with torch.inference_mode():
        want = dense(input_ids=ids).logits
        got = swapped(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_layers_int4_weights_are_dequantized_once_a_forward(
    ct_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gathered into one block a decoder layer, the int4 modules compute the same logits
    bit for bit, and a forward that multiplies dequantized weights (a prefill: on the
    CPU, every product) dequantizes each layer once, not each module."""
    model = _with_int4_modules(ct_checkpoint)
    tensors = load_file(str(ct_checkpoint / "model.safetensors"))
    ids = torch.tensor([_prompts()[1]])
    with torch.inference_mode():
        apart = model(input_ids=ids).logits
    layers = model.config.get_text_config().num_hidden_layers
    assert int4_blocks.gather(model) == layers
    linears = [m for m in model.modules() if isinstance(m, int4.Int4Linear)]
    outside = [m for m in linears if m.block is None]
    assert len({id(m.block) for m in linears if m.block is not None}) == layers
    for name in checkpoint._quantized_names(tensors):
        module = model.get_submodule(name)
        if name != "lm_head" and isinstance(module, int4.Int4Linear):
            assert torch.equal(module.packed, tensors[f"{name}.weight_packed"])
            assert torch.equal(module.scale, tensors[f"{name}.weight_scale"])
    dequantized: list[object] = []
    dense = kernels.dense
    monkeypatch.setattr(kernels, "dense", lambda w, dtype: dequantized.append(w) or dense(w, dtype))
    with torch.inference_mode():
        together = model(input_ids=ids).logits
    assert torch.equal(together, apart)
    assert len(dequantized) == layers + len(outside)


def test_consecutive_weights_of_a_block_are_one_view() -> None:
    """q/k/v and gate/up laid end to end in a block read back as one (rows, K) pair of
    views, the rows of each weight in order; a gap between weights or a different width
    is not a run."""
    model = load_model("random:tiny-gemma4", device="cpu").model
    checkpoint.quantize_model(model, GROUP, int4_modules=True)
    attn = model.get_decoder().layers[0].self_attn
    qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
    joined = int4_blocks.joined(qkv)
    assert joined is not None
    storage = attn.q_proj.block.packed.untyped_storage()
    assert joined[0].untyped_storage().data_ptr() == storage.data_ptr()
    torch.testing.assert_close(joined[0], torch.cat([m.packed for m in qkv]), rtol=0, atol=0)
    torch.testing.assert_close(joined[1], torch.cat([m.scale for m in qkv]), rtol=0, atol=0)
    assert int4_blocks.joined([attn.q_proj, attn.v_proj]) is None
    mlp = model.get_decoder().layers[0].mlp
    assert int4_blocks.joined([mlp.gate_proj, mlp.up_proj]) is not None
    assert int4_blocks.joined([mlp.gate_proj, mlp.up_proj, mlp.down_proj]) is None


def test_weights_that_are_not_a_run_of_a_block_merge_by_copy() -> None:
    """The decode program's merge of weights outside one run of a block (out of order
    here) copies their rows into one matrix; each module then reads its rows from it and
    no longer from the block, whose one dequantize would not cover them."""
    from engines.pytorch.programs import _merge_linears

    model = load_model("random:tiny-gemma4", device="cpu").model
    checkpoint.quantize_model(model, GROUP, int4_modules=True)
    attn = model.get_decoder().layers[0].self_attn
    order = [attn.v_proj, attn.q_proj]
    want = [(m.packed.clone(), m.scale.clone()) for m in order]
    packed, scale = _merge_linears(order)
    assert torch.equal(packed, torch.cat([p for p, _ in want]))
    assert torch.equal(scale, torch.cat([s for _, s in want]))
    for m, (p, s) in zip(order, want, strict=True):
        assert m.block is None and torch.equal(m.packed, p) and torch.equal(m.scale, s)
        assert m.packed.untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()


def _run_quantize(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engines.pytorch.quantize", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("q") / "tiny-gemma4"
    done = _run_quantize(
        "--model", "random:tiny-gemma4", "--out", str(out), "--group-size", "8",
        "--dtype", "float32",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def test_quantize_command_round_trip(written: Path) -> None:
    """What the command writes is what --quantize does at load, read back by our loader
    and by compressed-tensors alike."""
    config = json.loads((written / "config.json").read_text())
    assert checkpoint.check_quantization_config(config["quantization_config"]) == (GROUP,)
    back = load_model(str(written), device="cpu")
    assert back.quantization is not None and back.quantization.origin == "checkpoint"
    at_load = dict(load_model("random:tiny-gemma4", device="cpu").model.named_parameters())
    theirs = dict(_reference(written).named_parameters())
    for name, value in back.model.named_parameters():
        assert torch.equal(value, theirs[name]), name
        assert torch.equal(value, at_load[name]) == ("norm" in name or "scalar" in name), name


def test_quantize_at_load_groups_of_32() -> None:
    dense = load_model("random:tiny", device="cpu", seed=1)
    quant = load_model("random:tiny", device="cpu", seed=1, quantize="w4a16")
    assert quant.quantization is not None and quant.quantization.group_sizes == (32,)
    assert len(quant.quantization.modules) == 4 * 7 + 2  # 7 a layer, embedding, head
    assert quant.quantization.origin == "quantized at load"
    w = dense.model.model.layers[0].mlp.down_proj.weight
    q = quant.model.model.layers[0].mlp.down_proj.weight
    assert not torch.equal(q, w)
    assert torch.equal(q, int4.dequantize(*int4.quantize(w, 32), w.dtype))
    assert (q - w).abs().max() <= w.abs().max() / 7.5 / 2 + 1e-6
    # The load's log counts the int4 weights' values with the parameters left.
    def values(model: torch.nn.Module) -> int:
        return sum(p.numel() for p in model.parameters()) + int4.value_count(model)

    assert int4.value_count(dense.model) == 0
    assert values(quant.model) == values(dense.model)


def _edited(src: Path, dst: Path, qc_edit: dict[str, object] | None = None) -> Path:
    shutil.copytree(src, dst)
    if qc_edit is not None:
        config = json.loads((dst / "config.json").read_text())
        weights = config["quantization_config"]["config_groups"]["group_0"]
        for key, value in qc_edit.items():
            if key in ("num_bits", "type", "symmetric", "strategy", "actorder", "group_size"):
                weights["weights"][key] = value
            else:
                weights[key] = value
        (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize(
    ("edit", "found"),
    [
        ({"symmetric": False}, "asymmetric"),
        ({"num_bits": 8}, "8-bit int"),
        ({"type": "float"}, "4-bit float"),
        ({"actorder": "group"}, "activation ordering"),
        ({"strategy": "channel"}, "strategy 'channel'"),
        ({"format": "float-quantized"}, "format 'float-quantized'"),
        ({"input_activations": {"num_bits": 8, "type": "int"}}, "input_activations"),
    ],
)
def test_unsupported_schemes_are_refused_in_one_line(
    written: Path, tmp_path: Path, edit: dict[str, object], found: str
) -> None:
    folder = _edited(written, tmp_path / "m", edit)
    with pytest.raises(checkpoint.UnsupportedCheckpoint) as err:
        load_model(str(folder), device="cpu")
    message = str(err.value)
    assert found in message and "supported:" in message and "\n" not in message


def _retensor(folder: Path, edit: dict[str, torch.Tensor | None]) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    for key, value in edit.items():
        if value is None:
            tensors.pop(key)
        else:
            tensors[key] = value
    save_file(tensors, str(folder / "model.safetensors"))


def test_bad_checkpoints_are_refused_in_one_line(written: Path, tmp_path: Path) -> None:
    name = "model.layers.1.mlp.down_proj"
    cases: list[tuple[dict[str, torch.Tensor | None], str]] = [
        ({f"{name}.weight_scale": None}, "lacks weight_scale"),
        ({f"{name}.weight_packed": torch.zeros(64, 3, dtype=torch.int32)}, "weight_packed has"),
        ({f"{name}.weight_shape": torch.tensor([64, 64])}, "weight_shape (64, 64)"),
        ({f"{name}.weight_scale": torch.ones(64, 3)}, "scale groups"),
        ({f"{name}.weight_zero_point": torch.zeros(64, 2, dtype=torch.int32)}, "zero_point"),
    ]
    for i, (edit, found) in enumerate(cases):
        folder = _edited(written, tmp_path / str(i))
        _retensor(folder, edit)
        with pytest.raises(checkpoint.UnsupportedCheckpoint) as err:
            load_model(str(folder), device="cpu")
        assert found in str(err.value) and "\n" not in str(err.value), str(err.value)
    # The command line says so in one line, no traceback.
    done = _run_quantize("--model", str(folder), "--out", str(tmp_path / "x"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "zero_point" in done.stderr


def test_decode_program_runs_int4_weights_as_the_dense_dequantized_model() -> None:
    """The Gemma 4 decode program over int4 modules (merged q/k/v and gate/up as packed
    rows, int4 embeddings and tied head), eager and traced for compilation (aot_eager:
    no graph breaks), against the same program over the dequantized dense weights."""
    from engines.pytorch.programs import Gemma4DecodeProgram, ProgramOptions

    dense = load_model("random:tiny-gemma4", device="cpu")
    checkpoint.quantize_model(dense.model, GROUP)
    packed = load_model("random:tiny-gemma4", device="cpu")
    checkpoint.quantize_model(packed.model, GROUP, int4_modules=True)
    assert isinstance(packed.model.get_output_embeddings(), int4.Int4Linear)
    prompts = {0: [257, *range(40, 70)], 1: [257, *range(70, 75)]}
    outs = []
    for loaded, compile_mode in ((dense, None), (packed, None), (packed, "default")):
        runner = ModelRunner(
            loaded, num_slots=2, batch_invariant=False, batched_decode=True, decode_program=True
        )
        assert runner.program is not None
        if loaded is packed:  # merged from the layer's block, not copied
            q_proj = loaded.model.get_decoder().layers[0].self_attn.q_proj
            w_qkv = runner.program.layers[0].w_qkv
            assert isinstance(w_qkv, tuple) and q_proj.block is not None
            assert w_qkv[0].data_ptr() == q_proj.block.packed.data_ptr()
        if compile_mode is not None:
            torch._dynamo.reset()
            options = ProgramOptions(compile_mode=compile_mode, compile_backend="aot_eager")
            runner.program = Gemma4DecodeProgram(
                loaded.model, runner.cache, loaded.max_model_len, options
            )
        for slot, prompt in prompts.items():
            runner.prefill(slot, prompt)
        with torch.inference_mode():
            outs.append(runner.decode([0, 1], [60, 75], [31, 6]).clone())
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[2], outs[0], rtol=1e-5, atol=1e-5)


def test_describe_names_the_weights_form_for_the_manifest(written: Path) -> None:
    from engines.pytorch.describe import weights_form

    text = weights_form(str(written), "none")
    assert text.startswith("W4A16 checkpoint (compressed-tensors pack-quantized")
    assert "group 8" in text and "Linear" in text
    assert weights_form("random:tiny", "none") == "dense (random weights)"
    assert "quantized at load" in weights_form("random:tiny", "w4a16")
