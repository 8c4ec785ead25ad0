# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# TORCH_SPEC is installed only when the venv has no torch, so a user's CUDA build is kept.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.specstrat-installed

.PHONY: demo test test-slow lint typecheck pytest bench clean

$(PY):
	python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

demo: $(STAMP)
	$(VENV)/bin/specstrat demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(VENV)/bin/pytest -m "not slow"

# The full matrices (every algorithm x mode x D x stop tokens, disaggregation for each).
test-slow: $(STAMP)
	$(VENV)/bin/pytest -m slow

test: lint typecheck pytest

bench: $(STAMP)
	$(PY) bench/metadata.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis *.egg-info
