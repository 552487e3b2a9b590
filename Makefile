# Entry points (see README): `make lab`, `make test`, `make bench`.  Each sets up what it needs first.
#
#   make lab                         JupyterLab on notebooks/, with the extension and the example notebooks'
#                                    libraries (EXTRAS=examples: torch, gymnasium, pandas, numpy)
#   make lab EXTRAS=                 the lean environment: jupyter_cluster and JupyterLab only
#   make lab LAB_ARGS="--port 9999"  options for `jupyter lab` (--allow-root is added when run as root)
#   make test                        `make lint`, then the test suite (extras test, examples, kubernetes)
#   make lint                        ruff (lint + format check) on the Python, mypy on the package, eslint,
#                                    prettier and tsc on the TypeScript; settings in pyproject.toml, package.json
#   make bench                       the peer benchmark; the peer systems (ipyparallel) live in their own
#                                    environment $(BENCH_VENV) on top of $(VENV), never in the one `make lab` runs
PYTHON ?= python3
VENV ?= .venv
BENCH_VENV ?= .venv-bench
PY := $(VENV)/bin/python
EXTRAS ?= examples
TEST_EXTRAS := test examples kubernetes
LAB_ARGS ?=
# Jupyter refuses to run as root without this flag (containers, CI images, many cloud notebooks).
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
CORE := $(VENV)/.installed
extra_stamps = $(foreach e,$(1),$(VENV)/.extra-$(e))
# The requirements of one optional extra, read from the installed package's metadata, so an extra is
# added without rebuilding the editable install.
EXTRA_REQS = $(PY) -c 'import sys; from importlib.metadata import requires; print(" ".join(r.split(";")[0].strip() for r in requires("jupyter-cluster") or () if "extra == \"%s\"" % sys.argv[1] in r.replace(chr(39), chr(34))))'
# The JupyterLab extension: built by the editable install (hatch-jupyter-builder runs
# jlpm), rebuilt here when its TypeScript, styles or schema change.  Needs Node.js.
LABEXT := jupyter_cluster/labextension/package.json
LABEXT_SRC := $(shell find labextension/src labextension/style labextension/schema -type f 2>/dev/null) package.json yarn.lock tsconfig.json
JLPM := PATH="$(abspath $(VENV))/bin:$$PATH" $(abspath $(VENV))/bin/jlpm

.PHONY: setup lab lint test bench clean

setup: $(CORE) $(call extra_stamps,$(EXTRAS)) $(LABEXT)

# the package (editable) with its core dependencies, and the JupyterLab extension linked in
$(CORE): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/jupyter labextension develop --overwrite .
	touch $@

# one optional extra (examples, test, kubernetes); checked again whenever the package is reinstalled
$(VENV)/.extra-%: $(CORE)
	reqs="$$($(EXTRA_REQS) $*)"; test -n "$$reqs" || { echo "pyproject.toml has no optional extra named '$*'; EXTRAS takes examples, test, kubernetes or nothing."; exit 1; }; \
	$(PY) -m pip install --quiet $$reqs
	touch $@

$(LABEXT): $(LABEXT_SRC) | $(CORE)
	$(JLPM) install
	$(JLPM) build
	touch $(LABEXT)

lab: setup
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

# What to check and which rules: [tool.ruff] and [tool.mypy] in pyproject.toml, eslint.config.mjs and
# package.json's "lint" script.  The tools come from the test extra and package.json's devDependencies.
lint: $(CORE) $(VENV)/.extra-test $(LABEXT)
	$(PY) -m ruff check
	$(PY) -m ruff format --check
	$(PY) -m mypy
	$(JLPM) lint

# lint first: CI (.ci/run) runs only `make test`
test: lint $(CORE) $(call extra_stamps,$(TEST_EXTRAS)) $(LABEXT)
	$(PY) -m pytest -ra $(PYTEST_ARGS)

# The benchmark's environment sees everything in $(VENV) (a .pth line adds its site-packages) and adds
# only the peer systems, so `jupyter lab` from $(VENV) never loads ipyparallel's extensions.
$(BENCH_VENV)/.installed: pyproject.toml $(CORE)
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -c 'import sys, sysconfig; open(sysconfig.get_paths()["purelib"] + "/jupyter-cluster-main-venv.pth", "w").write("import site; site.addsitedir(%r)\n" % sys.argv[1])' \
		"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	$(BENCH_VENV)/bin/python -m pip install --quiet $$($(EXTRA_REQS) bench)
	touch $@

bench: $(BENCH_VENV)/.installed $(LABEXT)
	$(BENCH_VENV)/bin/python benchmarks/bench_peers.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) build dist jupyter_cluster/labextension node_modules labextension/lib tsconfig.tsbuildinfo
