# Two entry points (see README): `make lab` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup lab test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,examples,kubernetes,bench]"
	touch $(STAMP)

lab: setup
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks

test: setup
	$(PY) -m pytest -ra $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/bench_peers.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist jupyter_cluster/labextension node_modules labextension/lib
