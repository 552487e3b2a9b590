# Entry points (see README): `make lab`, `make test`, `make bench`.  Each sets up what it needs first.
#
#   make lab                         JupyterLab on notebooks/ from its own environment $(LAB_VENV): the package,
#                                    JupyterLab, the extension and the example notebooks' libraries
#                                    (EXTRAS=examples: torch, gymnasium, pandas, numpy); no test tools
#   make lab EXTRAS=                 the lean lab environment: jupyter_cluster and JupyterLab only
#   make lab LAB_ARGS="--port 9999"  options for `jupyter lab` (--allow-root is added when run as root)
#   make test                        `make lint`, then the fast layers of the test suite (unit and real-cluster
#                                    tests) in the development environment $(VENV) (extras test, examples,
#                                    kubernetes); the slow, browser and netns tests are skipped (opt-in); two
#                                    pytest-xdist processes (TEST_WORKERS=2; TEST_WORKERS=0 for one)
#   make test-all                    `make lint`, then every test, the slow, browser (Chromium) and netns (root)
#                                    ones included: what .ci/run runs
#   make lint                        ruff (lint + format check) on the Python, mypy on the package, import-linter's
#                                    layer contracts (pyproject.toml [tool.importlinter]), eslint,
#                                    prettier and tsc on the TypeScript; settings in pyproject.toml, package.json
#   make as-installed                build the sdist and wheel, install the wheel in fresh environments under
#                                    $(AS_INSTALLED_DIR) and run real kernels there (.ci/as_installed.py)
#   make notebooks                   execute notebooks/*.ipynb at CI size and write their outputs in place (the
#                                    charts' static copies, so GitHub and nbviewer show the results); commit them
#   make bench                       the peer benchmark; the peer systems (ipyparallel) live in their own
#                                    environment $(BENCH_VENV) on top of $(VENV), never in the lab's or the tests'
PYTHON ?= python3
VENV ?= .venv
LAB_VENV ?= .venv-lab
BENCH_VENV ?= .venv-bench
PY := $(VENV)/bin/python
EXTRAS ?= examples
TEST_EXTRAS := test examples kubernetes
LAB_ARGS ?=
AS_INSTALLED_DIR ?= build/as-installed
# Jupyter refuses to run as root without this flag (containers, CI images, many cloud notebooks).
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
CORE := $(VENV)/.installed
LAB_CORE := $(LAB_VENV)/.installed
# extra_stamps(venv, extras): one stamp per optional extra installed in that environment
extra_stamps = $(foreach e,$(2),$(1)/.extra-$(e))
# The requirements of one optional extra, read from the installed package's metadata (the python of the
# environment is $(1)), so an extra is added without rebuilding the editable install.
EXTRA_REQS = $(1)/bin/python -c 'import sys; from importlib.metadata import requires; print(" ".join(r.split(";")[0].strip() for r in requires("jupyter-cluster") or () if "extra == \"%s\"" % sys.argv[1] in r.replace(chr(39), chr(34))))'
# The JupyterLab extension: built by the editable install (hatch-jupyter-builder runs
# jlpm), rebuilt here when its TypeScript, styles or schema change.  Needs Node.js.
LABEXT := jupyter_cluster/labextension/package.json
LABEXT_SRC := $(shell find labextension/src labextension/style labextension/schema -type f 2>/dev/null) package.json yarn.lock tsconfig.json
# jlpm comes from whichever environment the goal set up: the lab's for `make lab`, $(VENV) otherwise
BUILD_VENV = $(VENV)
JLPM = PATH="$(abspath $(BUILD_VENV))/bin:$$PATH" $(abspath $(BUILD_VENV))/bin/jlpm
# The editable install is the development set-up of the JupyterLab extension template: jupyter-builder
# (which `jupyter labextension develop` now defers to, with a deprecation) links the extension in.
BUILDER := "jupyter-builder>=1.2,<2"

.PHONY: setup lab lint test test-all as-installed notebooks bench clean
# Prerequisites are listed in the order they must be made (an environment before the extension its
# jlpm rebuilds); the lab's and the tests' environments are the two goals' only difference.
.NOTPARALLEL:
.SECONDEXPANSION:

# the development environment, as `make test` uses it
setup: $(CORE) $(call extra_stamps,$(VENV),$(TEST_EXTRAS)) $(LABEXT)

# An environment with the package (editable) and its core dependencies, the extension linked in.
$(sort $(CORE) $(LAB_CORE)): pyproject.toml
	test -x $(@D)/bin/python || $(PYTHON) -m venv $(@D)
	$(@D)/bin/python -m pip install --quiet --upgrade pip
	# `jupyter-builder develop` (below) leaves an install.json in the built extension; the wheel ships
	# labextension/install.json there, and a second copy fails the next reinstall (hatch: "a second file")
	rm -f jupyter_cluster/labextension/install.json
	$(@D)/bin/python -m pip install --quiet -e . $(BUILDER)
	PATH="$(abspath $(@D))/bin:$$PATH" $(@D)/bin/jupyter-builder develop --overwrite .
	touch $@

# One optional extra (examples, test, kubernetes) in one environment; checked again whenever the
# package is reinstalled there.
EXTRA_TARGETS := $(sort $(call extra_stamps,$(VENV),$(TEST_EXTRAS) $(EXTRAS)) $(call extra_stamps,$(LAB_VENV),$(EXTRAS)))
$(EXTRA_TARGETS): $$(@D)/.installed
	reqs="$$($(call EXTRA_REQS,$(@D)) $(patsubst .extra-%,%,$(@F)))"; test -n "$$reqs" || { echo "pyproject.toml has no optional extra named '$(patsubst .extra-%,%,$(@F))'; EXTRAS takes examples, test, kubernetes or nothing."; exit 1; }; \
	$(@D)/bin/python -m pip install --quiet $$reqs
	touch $@

$(LABEXT): $(LABEXT_SRC)
	$(JLPM) install
	$(JLPM) build
	touch $(LABEXT)

lab: BUILD_VENV = $(LAB_VENV)
lab: $(LAB_CORE) $(call extra_stamps,$(LAB_VENV),$(EXTRAS)) $(LABEXT)
	$(LAB_VENV)/bin/jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

# What to check and which rules: [tool.ruff] and [tool.mypy] in pyproject.toml, eslint.config.mjs and
# package.json's "lint" script.  The tools come from the test extra and package.json's devDependencies.
lint: $(CORE) $(VENV)/.extra-test $(LABEXT)
	$(PY) -m ruff check
	$(PY) -m ruff format --check
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) .ci/module_sizes.py
	$(JLPM) lint

# lint first: CI (.ci/run) runs `make setup`, then `make as-installed` beside `make test-all`.  The slowest
# tests' times are printed at the end (--durations), so a run says where its minutes went.
# Tests run in $(TEST_WORKERS) pytest-xdist processes: most of a test's time is spent waiting for the
# clusters, kernels, servers and browsers it starts, so two at a time on two cores cut the wall time
# (README).  --dist loadfile keeps a module's tests in one process, in order: a module-scoped cluster,
# server or browser is started once, and the tests of one module (one test SLURM, one set of netns
# hosts) never run beside each other.  Tests of different modules must tolerate each other, as they
# tolerate other test sessions on the machine.  TEST_WORKERS=0: one process, as before.
# --no-loadscope-reorder: the modules are handed out in the order tests/conftest.py gives them (the
# longest first, LONGEST_FIRST), not by their number of tests, so that both processes finish together.
# Both goals end by printing their own wall time, setup and lint included (the README's figures).
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder,)
# took(goal): print how long this make has run, as "make test: 9 min 12 s"; the exit status stays pytest's
MAKE_STARTED := $(shell date +%s)
took = status=$$?; t=$$(( $$(date +%s) - $(MAKE_STARTED) )); echo "make $(1): $$((t / 60)) min $$((t % 60)) s (setup and lint included)"; exit $$status
test: lint $(CORE) $(call extra_stamps,$(VENV),$(TEST_EXTRAS)) $(LABEXT)
	$(PY) -m pytest -ra --durations=15 $(XDIST) $(PYTEST_ARGS); $(call took,test)

test-all: lint $(CORE) $(call extra_stamps,$(VENV),$(TEST_EXTRAS)) $(LABEXT)
	$(PY) -m pytest -ra --durations=25 --run-all $(XDIST) $(PYTEST_ARGS); $(call took,test-all)

# The product as users get it: the release builds, installed from the wheel without Node.js, driven
# through real kernels by nbclient from $(VENV).
as-installed: $(CORE) $(VENV)/.extra-test
	$(PY) .ci/as_installed.py --workdir $(AS_INSTALLED_DIR) $(AS_INSTALLED_ARGS)

# The example notebooks with their outputs, as a reader sees them on GitHub: executed at CI size by nbclient
# (the same environment as tests/packaging/test_notebooks.py), volatile bits stripped (.ci/execute_notebooks.py).
notebooks: $(CORE) $(call extra_stamps,$(VENV),test examples) $(LABEXT)
	$(PY) .ci/execute_notebooks.py $(NOTEBOOKS_ARGS)

# The benchmark's environment sees everything in $(VENV) (a .pth line adds its site-packages) and adds
# only the peer systems, so `jupyter lab` never loads ipyparallel's extensions.
$(BENCH_VENV)/.installed: pyproject.toml $(CORE)
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -c 'import sys, sysconfig; open(sysconfig.get_paths()["purelib"] + "/jupyter-cluster-main-venv.pth", "w").write("import site; site.addsitedir(%r)\n" % sys.argv[1])' \
		"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	$(BENCH_VENV)/bin/python -m pip install --quiet $$($(call EXTRA_REQS,$(VENV)) bench)
	touch $@

bench: $(BENCH_VENV)/.installed $(LABEXT)
	$(BENCH_VENV)/bin/python benchmarks/bench_peers.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(LAB_VENV) $(BENCH_VENV) build dist jupyter_cluster/labextension node_modules labextension/lib tsconfig.tsbuildinfo
