"""Model loading: dtype choice, seeded random models, the Gemma 4 E2B architecture (built on
the meta device, no memory), and the local-folder path through the same loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.pytorch.model import (
    RANDOM_MODELS,
    build_random_model,
    load_model,
    resolve_device,
    resolve_dtype,
)


def test_dtype_auto_is_float32_on_cpu_and_names_resolve() -> None:
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("bf16", cpu) == torch.bfloat16
    assert resolve_dtype("float16", cpu) == torch.float16
    with pytest.raises(ValueError, match="--dtype"):
        resolve_dtype("int3", cpu)
    assert resolve_device("cpu").type == "cpu"


def test_unknown_random_model_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="random:tiny"):
        load_model("random:nope", device="cpu")


def test_random_tiny_is_seeded() -> None:
    a = load_model("random:tiny", device="cpu", seed=3)
    b = load_model("random:tiny", device="cpu", seed=3)
    for (name, pa), (_, pb) in zip(
        a.model.named_parameters(), b.model.named_parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
    assert a.dtype == torch.float32
    assert a.max_model_len == RANDOM_MODELS["tiny"].max_model_len
    assert a.eos_token_ids == [258, 260]


def test_gemma4_e2b_architecture_on_meta_device() -> None:
    model, _tok, max_len = build_random_model(
        "gemma-4-e2b", dtype=torch.bfloat16, device=torch.device("meta")
    )
    cfg = model.config
    assert type(model).__name__ == "Gemma4ForCausalLM"
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads) == (35, 1536, 1)
    assert cfg.layer_types.count("full_attention") == 7
    assert model.model.first_kv_shared_layer_idx == 15
    assert tuple(model.model.embed_tokens_per_layer.weight.shape) == (262_144, 35 * 256)
    total = sum(p.numel() for p in model.parameters())
    assert 4.5e9 < total < 4.8e9  # text stack: ~2.35B PLE table + ~2.3B streamed per step
    assert max_len == 8192


def test_local_folder_loads_through_the_same_path(tmp_path: Path) -> None:
    random = load_model("random:tiny", device="cpu", seed=1)
    random.model.save_pretrained(tmp_path)
    random.tokenizer.save_pretrained(tmp_path)
    folder = load_model(str(tmp_path), device="cpu")
    ids = torch.tensor([random.tokenizer.encode("same weights")])
    with torch.no_grad():
        assert torch.equal(random.model(ids).logits, folder.model(ids).logits)
    assert folder.eos_token_ids == random.eos_token_ids
    assert folder.tokenizer.encode("é") == random.tokenizer.encode("é")
