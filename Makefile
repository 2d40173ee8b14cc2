# The two commands a fresh machine needs (see README): `make run` and `make test`.
# Every target sets itself up: a virtual environment in .venv, the project installed
# editable with its dev extras, and llama.cpp's CPU server built once into a cache.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

CDK_CLI_DIR := .cache/cdk-cli
CDK_CLI     := $(CDK_CLI_DIR)/node_modules/aws-cdk/bin/cdk
CDK         := PATH="$(abspath $(BIN)):$$PATH" CDK_DISABLE_CLI_TELEMETRY=true $(BIN)/node $(CDK_CLI)

.PHONY: setup run test lint llama-server bootstrap synth deploy destroy clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# BFCL's questions and official checker, as an instance's agent/install.sh installs them.
	$(BIN)/python -m pip install -q --no-deps -r agent/requirements-nodeps.txt
	@rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP) llama-server $(CDK_CLI)

# The CDK CLI, pinned by package-lock.json, run with the venv's Node 24.
$(CDK_CLI): infra/cdk-cli/package.json infra/cdk-cli/package-lock.json $(STAMP)
	mkdir -p $(CDK_CLI_DIR) && cp infra/cdk-cli/package*.json $(CDK_CLI_DIR)/
	$(BIN)/npm ci --prefix $(CDK_CLI_DIR) --no-fund --no-audit --loglevel=error
	@touch $@

bootstrap: $(CDK_CLI)
	$(CDK) bootstrap --no-notices $(CDK_ARGS)

synth: $(CDK_CLI)
	$(CDK) synth --quiet --no-notices

deploy: $(CDK_CLI)
	$(CDK) deploy BenchStack --no-notices $(CDK_ARGS)

destroy: $(CDK_CLI)
	$(CDK) destroy BenchStack --no-notices

llama-server: $(STAMP)
	$(BIN)/python -m engines.builds.llamacpp

run: setup
	$(BIN)/bench run

test: setup lint
	$(BIN)/python -m pytest -q

# ruff, then mypy over the files [tool.mypy] names (pyproject.toml).
lint: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m mypy

clean:
	rm -rf $(VENV) results $(CDK_CLI_DIR) cdk.out
