# The two README commands. Both install first (idempotent): torch is pinned by constraints.txt, so a CPU
# machine takes the local 2.13.0 wheel instead of a multi-GB CUDA build.
PY ?= python3
PIP_INSTALL = $(PY) -m pip install -q -c constraints.txt

.PHONY: install run test
install:
	$(PIP_INSTALL) -e .

run: install
	$(PY) -m fafo.bench $(ARGS)

test: install
	HF_HUB_OFFLINE=1 WANDB_MODE=disabled $(PY) -m pytest $(PYTEST_ARGS)
