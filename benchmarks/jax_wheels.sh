# Sourced by the JAX engine's GPU scripts: the machine has torch and JAX with CUDA but
# reaches no package index, so the wheels of what else the engines need (transformers,
# pydantic, starlette, uvicorn, httptools, orjson) are carried in $WHEELS and installed
# into /tmp/site (put first on PYTHONPATH), if present. Log: $OUT/pip.log.
wheels=()
for name in transformers pydantic pydantic_core annotated_types typing_inspection \
  typing_extensions starlette uvicorn orjson httptools; do
  for f in "$WHEELS"/"$name"-[0-9]*.whl; do [ -e "$f" ] && wheels+=("$f"); done
done
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}" > "$OUT/pip.log" 2>&1
  export PYTHONPATH="/tmp/site:$PWD"
fi
