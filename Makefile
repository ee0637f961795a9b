# The two commands of the README are `make demo` and `make test`; .ci/run calls `make test`.
# The Makefile makes its own virtual environment (.venv) and builds the extension into it.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-stamp
EXT_STAMP := $(VENV)/.ext-stamp
RUST_SRC := $(shell find rust -name '*.rs') Cargo.toml rust/py/Cargo.toml

.PHONY: all venv develop demo test test-rust test-python lint fmt bench bench-activation clean fuzz-smoke

all: develop

$(STAMP): requirements-dev.txt requirements-torch.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q -r requirements-torch.txt
	touch $@

venv: $(STAMP)

# Build the extension in release mode and install the package (editable) into .venv.
$(EXT_STAMP): $(STAMP) $(RUST_SRC)
	VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH maturin develop --release -q
	touch $@

develop: $(EXT_STAMP)

demo: develop
	$(PY) -m shardpoint.demo

test: test-rust test-python

test-rust:
	cargo test --release -p shardpoint-core
	-@command -v cargo-fuzz >/dev/null && $(MAKE) fuzz-smoke || echo "cargo-fuzz not installed: fuzz targets built only by 'cargo check' in fuzz/"

test-python: develop
	$(PY) -m pytest -q -p no:cacheprovider tests

lint: develop
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	$(PY) -m mypy.stubtest shardpoint._core

fmt:
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches
	$(VENV)/bin/ruff check --fix python tests benches

bench: develop
	$(PY) benches/bench_storage.py

bench-activation: develop
	$(PY) benches/bench_activation.py

clean:
	rm -rf $(VENV) target
