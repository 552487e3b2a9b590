# Two entry points (see README): `make lab` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The JupyterLab extension: built by the editable install (hatch-jupyter-builder runs
# jlpm), rebuilt here when its TypeScript, styles or schema change.  Needs Node.js.
LABEXT := jupyter_cluster/labextension/package.json
LABEXT_SRC := $(shell find labextension/src labextension/style labextension/schema -type f 2>/dev/null) package.json yarn.lock tsconfig.json
JLPM := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(CURDIR)/$(VENV)/bin/jlpm

.PHONY: setup lab test bench clean

setup: $(STAMP) $(LABEXT)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,examples,kubernetes,bench]"
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/jupyter labextension develop --overwrite .
	touch $(STAMP)

$(LABEXT): $(LABEXT_SRC) | $(STAMP)
	$(JLPM) install
	$(JLPM) build
	touch $(LABEXT)

lab: setup
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks

test: setup
	$(PY) -m pytest -ra $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/bench_peers.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist jupyter_cluster/labextension node_modules labextension/lib tsconfig.tsbuildinfo
