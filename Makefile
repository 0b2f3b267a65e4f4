# Every target sets up what it needs itself, idempotently: a second run is fast.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
APT_PACKAGES := clang lld wabt chromium mesa-vulkan-drivers libvulkan1
NODE_STAMP := node_modules/.weei-installed
PORT ?= 8000

.PHONY: setup demo demo-local test test-unit test-browser bench wasm site serve clean

setup: $(STAMP) .apt-stamp $(NODE_STAMP)

# System toolchain for building WebAssembly models and kernels, Chromium for
# the browser tests (Playwright drives /usr/bin/chromium; it never downloads
# a browser), Mesa's Vulkan drivers (lavapipe: the GPU tests' software
# adapter for wgpu-py), and npm when node is missing.
.apt-stamp: Makefile
	@missing="$(APT_PACKAGES)"; \
	if ! command -v npm >/dev/null; then missing="$$missing nodejs npm"; fi; \
	if ! command -v clang >/dev/null || ! command -v wasm-ld >/dev/null || ! command -v wasm-objdump >/dev/null \
	   || ! [ -x /usr/bin/chromium ] || ! command -v npm >/dev/null \
	   || ! ls /usr/share/vulkan/icd.d/lvp_icd*.json /usr/lib/*/libvulkan.so.1 >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@touch $@

# Pyodide from npm, at the version package-lock.json pins.
$(NODE_STAMP): package.json package-lock.json .apt-stamp
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[cpython,dev,flower]'
	@touch $@

# The main job: weei serve, three headless Chromium pages and an agent train both demo jobs over WebRTC.
demo: setup
	$(VPY) build.py site
	$(VENV)/bin/weei demo --browsers --out out/demo

# The same jobs in one process (controllers over an in-memory transport): no browser needed.
demo-local: setup
	$(VENV)/bin/weei demo --out out/demo-local

test: setup
	$(VPY) -m pytest tests/unit tests/browser

# The unit tests without the model builds (marker `build`) and the Flower runs (marker `flower`), on two processes
# (pytest-xdist; --dist loadscope keeps a module's tests, and so its module
# fixtures, on one process): about a minute on two idle cores.
test-unit: setup
	$(VPY) -m pytest tests/unit -m "not build and not flower" -n 2 --dist loadscope

test-browser: setup
	$(VPY) -m pytest tests/browser

# The static site (dist/) that `weei serve` serves.
site: setup
	$(VPY) build.py site

serve: site
	$(VENV)/bin/weei serve --port $(PORT)

# Every parser of outside input (17 of them), a million seeded mutations each, on every
# core; failing inputs go to out/fuzz/ (tests/fuzz/run.py --help). Nightly: hours on two cores.
.PHONY: fuzz
fuzz: setup
	$(VPY) tests/fuzz/run.py

bench: setup
	$(VPY) bench/run_all.py

wasm: setup
	$(VPY) build.py wasm

clean:
	rm -rf $(VENV) .apt-stamp build out dist node_modules
