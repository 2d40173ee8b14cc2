# The two commands a fresh machine needs (see README): `make run` and `make test`.
# Every target sets itself up: a virtual environment in .venv, the project installed
# editable with its dev extras, and llama.cpp's CPU server built once into a cache.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: setup run test lint llama-server clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP) llama-server

llama-server: $(STAMP)
	$(BIN)/python -m engines.builds.llamacpp

run: setup
	$(BIN)/bench run

test: setup
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/python -m ruff check .

clean:
	rm -rf $(VENV) results
