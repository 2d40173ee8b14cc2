#!/usr/bin/env bash
# The wheels the GPU scripts (`int4_h200.sh`, `pytorch_engine_h200.sh`) carry to a CUDA
# machine that has Python 3.12, torch, Triton and NVML but reaches no package index:
# what the engine's server, the benchmarks and the CUDA tests import beyond those
# (transformers at the engine's pin, pydantic, starlette, uvicorn, httpx, rich, pytest,
# gguf...). Downloaded here into DEST (default ./.whl), without their dependencies, so
# the set stays small (about 20 MB); the scripts install them into /tmp/site first.
#
#   bash benchmarks/device_wheels.sh [DEST]
set -euo pipefail
DEST="${1:-.whl}"
mkdir -p "$DEST"
PLATFORM=(--python-version 3.12 --implementation cp --only-binary=:all: --no-deps
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux1_x86_64)
# transformers exactly as pyproject.toml's `pytorch` extra pins it.
TRANSFORMERS=$(grep -o '"transformers==[0-9.]*"' pyproject.toml | head -1 | tr -d '"')
python3 -m pip download -q "${PLATFORM[@]}" -d "$DEST" "$TRANSFORMERS" pydantic \
  annotated-types typing-inspection typing-extensions starlette uvicorn h11 httptools \
  orjson anyio httpx httpcore certifi idna rich markdown-it-py mdurl pygments pytest \
  pluggy iniconfig gguf prometheus-client nvidia-ml-py tenacity
# pydantic pins its core exactly: take the version its metadata names.
CORE=$(unzip -p "$DEST"/pydantic-[0-9]*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==//p')
python3 -m pip download -q "${PLATFORM[@]}" -d "$DEST" "pydantic-core==$CORE"
du -sh "$DEST"
