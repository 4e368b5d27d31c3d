# Attention, Illustrated: build the book, run the tests.
#   make book   create .venv if missing, build the site into _build/html (every chapter executed)
#   make test   the same set-up, then every test (library, exercises, notebooks, built site, browser)
#   make serve  serve the built site on http://127.0.0.1:8000
#   make bench  performance measurements (ratios, side by side) -> benchmarks/results.{md,json}

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VENDOR := book/_static/vendor_root/vendor
PORT ?= 8000
# The book build pre-renders interactive views and runs chapters on the CPU unless told otherwise.
export TRANSFORMER_COURSE_STATIC := 1

.PHONY: book test test-lib serve notebooks lint clean bench

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

$(VENDOR)/mathjax/tex-svg.js: package.json package-lock.json
	npm ci --no-audit --no-fund --silent
	mkdir -p $(VENDOR)/mathjax
	cp node_modules/mathjax/es5/tex-svg.js $(VENDOR)/mathjax/tex-svg.js

book: $(STAMP) $(VENDOR)/mathjax/tex-svg.js
	$(PY) tools/sync_notebooks.py --check
	$(VENV)/bin/jupyter-book build . -W -n --keep-going --builder html
	@echo "Book built: $(CURDIR)/_build/html/index.html"

notebooks: $(STAMP)
	$(PY) tools/sync_notebooks.py

test-lib: $(STAMP)
	$(PY) -m pytest -m "not site and not browser"

test: book
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests tools benchmarks book/_ext

bench: $(STAMP)
	$(PY) benchmarks/run.py
	$(PY) benchmarks/translation.py

serve:
	$(PY) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

clean:
	rm -rf _build $(VENDOR)
