"""Loading a model for the engine: `random:<name>` models made in code, a local Hugging Face
folder, or a hub id, all through transformers' model classes, plus dtype and device choice.

Random models are built from a transformers config with seeded random weights and the
byte-level tokenizer of `tokenizer`; nothing is downloaded. A hub id needs network and,
for gated models, a token that huggingface_hub reads from the environment (HF_TOKEN):
the engine never takes a token on its command line.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from engines.pytorch import checkpoint, int4
from engines.serving.random_models import DEFAULT_MAX_MODEL_LEN, RANDOM_MODELS, RANDOM_PREFIX
from engines.serving.tokenizer import build_byte_tokenizer, generation_ids, stop_token_ids

log = logging.getLogger(__name__)

def resolve_device(spec: str) -> torch.device:
    """`auto` is the first CUDA device when there is one, else the CPU."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """`auto`: bf16 where the GPU computes in it (sm_80+), fp16 on older GPUs such as
    sm_75 (Turing has no bf16 datapath), float32 on CPU."""
    if spec == "auto":
        if device.type == "cuda":
            major, _minor = torch.cuda.get_device_capability(device)
            return torch.bfloat16 if major >= 8 else torch.float16
        return torch.float32
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
    }
    if spec not in names:
        raise ValueError(f"--dtype: unknown dtype {spec!r}; use auto or one of {sorted(names)}")
    return names[spec]


@dataclass
class LoadedModel:
    """A model ready to serve: weights on the device, tokenizer, and the engine's limits."""

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    eos_token_ids: list[int] = field(default_factory=list)
    # Ids the model may generate; None: every id the tokenizer has.
    output_ids: list[int] | None = None
    # Int4 weights (from a W4A16 checkpoint or --quantize); None: dense.
    quantization: checkpoint.Quantization | None = None

    @property
    def tokenizer_vocab_size(self) -> int:
        return len(self.tokenizer)


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    for candidate in (eos, tokenizer.eos_token_id):
        if candidate is None:
            continue
        for i in candidate if isinstance(candidate, list | tuple) else [candidate]:
            if int(i) not in ids:
                ids.append(int(i))
    return ids


def build_random_model(
    name: str, *, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, int]:
    """A random model by registry name: seeded weights, the byte tokenizer, its max length."""
    if name not in RANDOM_MODELS:
        known = ", ".join(f"{RANDOM_PREFIX}{n}" for n in RANDOM_MODELS)
        raise ValueError(f"--model: unknown random model {RANDOM_PREFIX}{name}; known: {known}")
    spec = RANDOM_MODELS[name]
    tokenizer = build_byte_tokenizer()
    config = spec.build_config(tokenizer)
    torch.manual_seed(seed)
    # Built straight on the device in the serving dtype: the E2B size in float32 on a
    # host would need ~20 GB first.
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=stop_token_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
    )
    return model, tokenizer, spec.max_model_len


def _quantization_config(source: str) -> tuple[Path | None, dict[str, object] | None]:
    """The source's folder (None for a hub id not yet fetched) and its quantization_config.
    A hub id's config.json alone is fetched to decide; the weights follow only if it is
    a W4A16 checkpoint (transformers fetches a dense one itself)."""
    local = Path(source).expanduser()
    if local.is_dir():
        config_file: Path | None = local / "config.json"
    else:
        from huggingface_hub import hf_hub_download

        config_file = Path(hf_hub_download(source, "config.json"))
    if config_file is None or not config_file.is_file():
        return (local if local.is_dir() else None), None
    qc = json.loads(config_file.read_text()).get("quantization_config")
    return config_file.parent, qc


def _load_w4a16(
    source: str, folder: Path, qc: dict[str, object], dtype: torch.dtype, device: torch.device
) -> tuple[PreTrainedModel, checkpoint.Quantization]:
    group_sizes = checkpoint.check_quantization_config(qc)
    if not (Path(source).expanduser().is_dir()):
        from huggingface_hub import snapshot_download

        folder = Path(
            snapshot_download(
                source, allow_patterns=["*.json", "*.safetensors", "*.model", "*.jinja", "*.txt"]
            )
        )
    config = AutoConfig.from_pretrained(str(folder))
    for holder in (config, config.get_text_config()):
        if hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    # Built on the device in the serving dtype, then filled: int4 modules replace the
    # quantized ones, so their random dense weights are freed before serving.
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    quant = checkpoint.load_into(model, folder, group_sizes)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return model, quant


def load_model(
    spec: str,
    *,
    dtype: str = "auto",
    device: str = "auto",
    seed: int = 0,
    max_model_len: int | None = None,
    served_name: str | None = None,
    quantize: str = "none",
    int4_configs: Path | None = None,
) -> LoadedModel:
    """Load `random:<name>`, a local folder, or a hub id; eval mode, on the device. A
    compressed-tensors W4A16 checkpoint loads as int4 (`checkpoint`); `quantize`
    "w4a16" quantizes a dense model at load. `int4_configs`: the int4 kernels' pinned
    table to use instead of the shipped one (`int4_tuning.use_pinned_tables`)."""
    if quantize not in checkpoint.QUANTIZE_CHOICES:
        raise ValueError(f"--quantize: {quantize!r}; use one of {checkpoint.QUANTIZE_CHOICES}")
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    output_ids: list[int] | None = None
    tokenizer: PreTrainedTokenizerBase
    quant: checkpoint.Quantization | None = None
    if spec.startswith(RANDOM_PREFIX):
        model, tokenizer, native_len = build_random_model(
            spec.removeprefix(RANDOM_PREFIX), dtype=torch_dtype, device=dev, seed=seed
        )
        output_ids = generation_ids(tokenizer)
    else:
        source = str(Path(spec).expanduser()) if Path(spec).expanduser().exists() else spec
        folder, qc = _quantization_config(source)
        tokenizer = AutoTokenizer.from_pretrained(source)
        if qc is not None and folder is not None:
            model, quant = _load_w4a16(source, folder, qc, torch_dtype, dev)
        else:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
            # transformers wraps PreTrainedModel.to in a decorator whose stub drops `self`.
            model = model.to(dev)  # type: ignore[arg-type]
        text_config = model.config.get_text_config()
        native_len = int(getattr(text_config, "max_position_embeddings", DEFAULT_MAX_MODEL_LEN))
    if quantize == "w4a16":
        if quant is not None:
            log.info("--quantize w4a16: %s is already int4; loaded as it is", spec)
        else:
            quant = checkpoint.quantize_model(model)
    if quant is not None and dev.type == "cuda":
        from engines.pytorch import int4_tuning

        # a bad table: one line now, not at the first launch
        int4_tuning.use_pinned_tables(int4_configs)
        gpu = int4_tuning.gpu_name()
        pinned_from = int4_tuning.pinned_source(gpu)
        if pinned_from is None:
            log.info(
                "int4: no pinned table names %s: the autotuner chooses each shape's block "
                "shape at its first launch", gpu
            )  # fmt: skip
        else:
            log.info("int4: block shapes pinned from %s's table", pinned_from)
    elif int4_configs is not None:
        log.info("--int4-configs %s: unused (no int4 weights on CUDA)", int4_configs)
    model.eval()
    limit = min(native_len, DEFAULT_MAX_MODEL_LEN) if max_model_len is None else max_model_len
    if limit > native_len:
        raise ValueError(f"--max-model-len {limit} exceeds the model's {native_len} positions")
    loaded = LoadedModel(
        name=served_name or spec,
        model=model,
        tokenizer=tokenizer,
        device=dev,
        dtype=torch_dtype,
        max_model_len=limit,
        eos_token_ids=_eos_ids(model, tokenizer),
        output_ids=output_ids,
        quantization=quant,
    )
    n_params = sum(p.numel() for p in model.parameters()) + int4.value_count(model)
    log.info(
        "loaded %s: %s, %.1fM params, %s on %s, max_model_len %d, eos %s%s",
        loaded.name,
        type(model).__name__,
        n_params / 1e6,
        torch_dtype,
        dev,
        limit,
        loaded.eos_token_ids,
        "" if quant is None else f", int4 {quant.summary()}",
    )
    return loaded
