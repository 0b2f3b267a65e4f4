# Every target sets up what it needs itself, idempotently: a second run is fast.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
APT_PACKAGES := clang lld wabt

.PHONY: setup demo test bench wasm clean

setup: $(STAMP) .apt-stamp

# System toolchain for building WebAssembly models and kernels.
.apt-stamp:
	@if ! command -v clang >/dev/null || ! command -v wasm-ld >/dev/null || ! command -v wasm-objdump >/dev/null; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(APT_PACKAGES); \
	fi
	@touch $@

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[cpython,dev]'
	@touch $@

demo: setup
	$(VENV)/bin/weei demo --out out/demo

test: setup
	$(VPY) -m pytest tests/unit

bench: setup
	$(VPY) bench/run_all.py

wasm: setup
	$(VPY) build.py wasm

clean:
	rm -rf $(VENV) .apt-stamp build out
