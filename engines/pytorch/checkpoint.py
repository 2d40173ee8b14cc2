"""W4A16 checkpoints: reading compressed-tensors `pack-quantized` folders into a model,
quantizing a dense model at load (`--quantize w4a16`), and writing a model back out in
that format (`python -m engines.pytorch.quantize`).

Only what the engine serves is accepted: 4-bit integer symmetric weights in groups (any
group size that is a multiple of 8 and divides the input width), no activation
quantization, ordering, zero points, sparsity or transforms. Anything else stops the load
with one line naming what was found and what is supported (`UnsupportedCheckpoint`).

On CUDA the quantized modules become `int4.Int4Linear` / `int4.Int4Embedding` (int4 in
GPU memory); on the CPU their dense weights are overwritten with q * scale and the dense
path runs (correctness, not speed). compressed-tensors itself is not needed at run time:
the format's facts are in `int4`; the tests use the library as the reference.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from contract.errors import BenchError
from engines.pytorch import int4, int4_blocks

log = logging.getLogger(__name__)

QUANT_METHOD = "compressed-tensors"
FORMAT = "pack-quantized"
SUPPORTED = (
    "compressed-tensors pack-quantized W4A16: 4-bit int symmetric weights, group strategy, "
    "no activation quantization"
)
QUANTIZE_CHOICES = ("none", "w4a16")


class UnsupportedCheckpoint(BenchError, ValueError):
    """A checkpoint the engine cannot serve as it is (one line: what and why)."""


@dataclass(frozen=True)
class Quantization:
    """What the loaded model's int4 weights are: format, group sizes, modules (by kind),
    and where they came from ("checkpoint" or "quantized at load")."""

    format: str
    group_sizes: tuple[int, ...]
    modules: tuple[int4.QuantizedModule, ...]
    origin: str

    def summary(self) -> dict[str, object]:
        kinds: dict[str, int] = {}
        for m in self.modules:
            kinds[m.kind] = kinds.get(m.kind, 0) + 1
        return {
            "format": self.format,
            "weights": "int4 symmetric",
            "group_sizes": list(self.group_sizes),
            "modules": kinds,
            "origin": self.origin,
        }


def _refuse(found: str) -> UnsupportedCheckpoint:
    return UnsupportedCheckpoint(f"quantization_config: {found}; supported: {SUPPORTED}")


def check_quantization_config(qc: dict[str, Any]) -> tuple[int, ...]:
    """The group sizes a `quantization_config` declares, or UnsupportedCheckpoint."""
    method = qc.get("quant_method")
    if method != QUANT_METHOD:
        raise _refuse(f"quant_method {method!r}")
    for key in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if qc.get(key):
            raise _refuse(f"{key} {qc[key]!r}")
    groups = qc.get("config_groups") or {}
    if not groups:
        raise _refuse("no config_groups")
    sizes: list[int] = []
    for name, group in groups.items():
        fmt = group.get("format") or qc.get("format")
        if fmt != FORMAT:
            raise _refuse(f"group {name} format {fmt!r}")
        for key in ("input_activations", "output_activations"):
            if group.get(key):
                raise _refuse(f"group {name} {key} {group[key]!r}")
        w = group.get("weights") or {}
        bits, kind = w.get("num_bits"), w.get("type")
        if bits != int4.BITS or kind != "int":
            raise _refuse(f"group {name} weights {bits}-bit {kind}")
        if not w.get("symmetric", True):
            raise _refuse(f"group {name} asymmetric weights")
        if w.get("strategy") != "group":
            raise _refuse(f"group {name} weight strategy {w.get('strategy')!r}")
        if w.get("actorder") not in (None, False):
            raise _refuse(f"group {name} activation ordering {w.get('actorder')!r}")
        if w.get("dynamic"):
            raise _refuse(f"group {name} dynamic weights")
        size = w.get("group_size")
        if not isinstance(size, int) or size < 1 or size % int4.PER_WORD:
            raise _refuse(f"group {name} group_size {size!r} (multiples of {int4.PER_WORD})")
        sizes.append(size)
    return tuple(sorted(set(sizes)))


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UnsupportedCheckpoint(f"{folder}: no .safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def _quantized_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    suffixes = (".weight_packed", ".weight_scale")
    return sorted({k.rsplit(".", 1)[0] for k in tensors if k.endswith(suffixes)})


def _module_shape(module: nn.Module, name: str) -> tuple[int, int]:
    if not isinstance(module, nn.Linear | nn.Embedding):
        raise UnsupportedCheckpoint(
            f"{name}: int4 weights for a {type(module).__name__}; supported: Linear, Embedding"
        )
    rows, cols = module.weight.shape
    return int(rows), int(cols)


def load_into(model: PreTrainedModel, folder: Path, group_sizes: tuple[int, ...]) -> Quantization:
    """Fill `model` (built from the folder's config) from a pack-quantized checkpoint."""
    tensors = _read_tensors(folder)
    quantized = _quantized_names(tensors)
    if not quantized:
        raise UnsupportedCheckpoint(f"{folder}: quantization_config but no weight_packed tensors")
    on_cuda = next(model.parameters()).device.type == "cuda"
    modules: list[int4.QuantizedModule] = []
    pending: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    for name in quantized:
        parts = {s: tensors.pop(f"{name}.{s}", None) for s in int4.TENSOR_NAMES}
        for extra in ("weight_zero_point", "weight_g_idx"):
            if f"{name}.{extra}" in tensors:
                raise _refuse(f"{name}.{extra} present (asymmetric or reordered weights)")
        packed, scale, stored_shape = (parts[s] for s in int4.TENSOR_NAMES)
        if packed is None or scale is None or stored_shape is None:
            missing = ", ".join(s for s in int4.TENSOR_NAMES if parts[s] is None)
            raise UnsupportedCheckpoint(f"{folder}: {name} lacks {missing}")
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise UnsupportedCheckpoint(f"{folder}: {name} is not a module of the model") from None
        shape = _module_shape(module, name)
        stored = tuple(int(v) for v in stored_shape.tolist())
        if stored != shape:
            raise UnsupportedCheckpoint(
                f"{folder}: {name}.weight_shape {stored}, the model's weight is {shape}"
            )
        try:
            group = int4.check(name, packed, scale, shape)
        except int4.Int4FormatError as exc:
            raise UnsupportedCheckpoint(f"{folder}: {exc}") from None
        pending.append((name, packed, scale))
        kind = "embedding" if isinstance(module, nn.Embedding) else "linear"
        modules.append(int4.QuantizedModule(name, kind, group))
    result = model.load_state_dict(tensors, strict=False)
    # Buffers the model derives from its config (Gemma's embed_scale) may be saved too.
    derived = {name for name, _ in model.named_buffers()}
    unexpected = [k for k in result.unexpected_keys if k not in derived]
    if unexpected:
        raise UnsupportedCheckpoint(
            f"{folder}: tensor {unexpected[0]} matches no parameter of "
            f"{type(model).__name__} ({len(unexpected)} such)"
        )
    covered = {f"{name}.weight" for name in quantized}
    tied = _tied(model)
    absent = [
        k
        for k in result.missing_keys
        if k not in covered and not (tied and k.endswith("lm_head.weight"))
    ]
    if absent:
        raise UnsupportedCheckpoint(f"{folder}: no tensor for {absent[0]} ({len(absent)} missing)")
    _apply(model, pending, on_cuda)
    return Quantization(FORMAT, group_sizes or _sizes(modules), tuple(modules), "checkpoint")


def _sizes(modules: list[int4.QuantizedModule]) -> tuple[int, ...]:
    return tuple(sorted({m.group_size for m in modules}))


def _apply(
    model: PreTrainedModel, pending: list[tuple[str, torch.Tensor, torch.Tensor]], on_cuda: bool
) -> None:
    """Install the int4 weights: int4 modules on CUDA, dequantized dense weights on CPU.
    A tied head whose own int4 copy equals the embedding's shares the embedding's."""
    embed_name = next(n for n, m in model.named_modules() if m is model.get_input_embeddings())
    by_name = {name: (packed, scale) for name, packed, scale in pending}
    head = model.get_output_embeddings()
    head_name = next((n for n, m in model.named_modules() if m is head), None)
    tied = _tied(model)
    for name, (packed, scale) in by_name.items():
        if tied and name == head_name and embed_name in by_name:
            e_packed, e_scale = by_name[embed_name]
            if not (torch.equal(packed, e_packed) and torch.equal(scale, e_scale)):
                raise UnsupportedCheckpoint(
                    f"{name}: the head is tied to {embed_name} but its int4 values differ"
                )
            continue
        if on_cuda:
            int4.install(model, name, packed, scale)
        else:
            int4.dequantize_into(model, name, packed, scale)
    if on_cuda and tied:
        int4.tie_head(model)
    if on_cuda:
        int4_blocks.gather(model)


def _tied(model: PreTrainedModel) -> bool:
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    return isinstance(head, nn.Linear) and head.weight is getattr(embed, "weight", None)


def _dense_weight(model: PreTrainedModel, name: str) -> torch.Tensor:
    module = model.get_submodule(name)
    if not isinstance(module, nn.Linear | nn.Embedding):
        raise UnsupportedCheckpoint(f"{name} is a {type(module).__name__}")
    return module.weight


def quantizable(model: PreTrainedModel) -> list[str]:
    """The modules `--quantize w4a16` turns to int4: the text decoder's Linear layers and
    embedding tables (vision and audio towers keep their weights), not a tied head (it
    follows the embedding)."""
    head = model.get_output_embeddings()
    tied = _tied(model)
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear | nn.Embedding):
            continue
        if tied and module is head:
            continue
        if any(part in name for part in ("vision", "audio")):
            continue
        names.append(name)
    return names


def quantize_model(
    model: PreTrainedModel,
    group_size: int = int4.DEFAULT_GROUP_SIZE,
    int4_modules: bool | None = None,
) -> Quantization:
    """Round-to-nearest symmetric int4 of every quantizable module, in place. Modules
    whose width the group size does not divide keep their dense weights (logged).
    `int4_modules`: int4 modules (None: on CUDA) rather than dequantized dense weights."""
    on_cuda = next(model.parameters()).device.type == "cuda"
    if int4_modules is not None:
        on_cuda = int4_modules
    pending: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    modules: list[int4.QuantizedModule] = []
    skipped: list[str] = []
    for name in quantizable(model):
        weight = _dense_weight(model, name)
        if weight.shape[1] % group_size:
            skipped.append(name)
            continue
        packed, scale = int4.quantize(weight, group_size)
        pending.append((name, packed, scale))
        kind = "embedding" if isinstance(model.get_submodule(name), nn.Embedding) else "linear"
        modules.append(int4.QuantizedModule(name, kind, group_size))
    if skipped:
        log.info("not quantized (width not a multiple of %d): %s", group_size, ", ".join(skipped))
    _apply(model, pending, on_cuda)
    if on_cuda:
        torch.cuda.empty_cache()
    return Quantization(FORMAT, (group_size,), tuple(modules), "quantized at load")


def quantization_config(group_size: int, ignore: list[str]) -> dict[str, object]:
    """The `quantization_config` compressed-tensors writes for this scheme."""
    return {
        "quant_method": QUANT_METHOD,
        "format": FORMAT,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "format": FORMAT,
                "targets": ["Linear", "Embedding"],
                "input_activations": None,
                "output_activations": None,
                "weights": {
                    "num_bits": int4.BITS,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": group_size,
                    "dynamic": False,
                    "actorder": None,
                },
            }
        },
        "ignore": ignore,
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "transform_config": {},
    }


def save_w4a16(model: PreTrainedModel, out: Path, group_size: int = int4.DEFAULT_GROUP_SIZE) -> int:
    """Write a dense model as a pack-quantized W4A16 checkpoint (config.json with its
    quantization_config, model.safetensors); returns the number of int4 modules."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in quantizable(model) if _dense_weight(model, n).shape[1] % group_size == 0]
    tensors: dict[str, torch.Tensor] = {}
    done: set[str] = set()
    if _tied(model):
        done.update(k for k in model.state_dict() if k.endswith("lm_head.weight"))
    for name in names:
        weight = _dense_weight(model, name)
        packed, scale = int4.quantize(weight, group_size)
        tensors[f"{name}.weight_packed"] = packed.cpu()
        tensors[f"{name}.weight_scale"] = scale.cpu()
        tensors[f"{name}.weight_shape"] = torch.tensor(list(weight.shape), dtype=torch.int32)
        done.add(f"{name}.weight")
    for key, value in model.state_dict().items():
        if key not in done:
            tensors[key] = value.detach().cpu().contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(str(out))
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    ignore = [n for n in quantizable(model) if n not in names]
    config["quantization_config"] = quantization_config(group_size, ignore)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    return len(names)
