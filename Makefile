# outcore: two commands on a fresh machine.
#   make demo   trains a ResNet on the emulated device under a third of its in-core peak
#   make test   lints (ruff), type-checks src/ (mypy) and runs the test suite (the default, fast
#               set; slow tests are covered by benchmarks; tests/cuda skip without a GPU)
#   make test-cuda  on a machine with an NVIDIA GPU: its own venv with torch 2.13's CUDA build
#               and the CUDA suite (scripts/test_cuda.sh; docs/cuda.md)
#   make bench  the paper reproductions, quick versions (benchmarks/repro_*.py --quick)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pytest-xdist workers for make test (2: CI's cores; 0 runs the suite in one process)
TEST_WORKERS ?= 2

.PHONY: demo test test-cuda setup bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) -m outcore.demo

test: setup
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m mypy src/outcore
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

test-cuda:
	bash scripts/test_cuda.sh

bench: setup
	for f in benchmarks/repro_*.py; do $(PY) $$f --quick || exit 1; done

clean:
	rm -rf $(VENV) out .pytest_cache
