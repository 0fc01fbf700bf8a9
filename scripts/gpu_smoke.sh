#!/usr/bin/env bash
# A GPU smoke of the paths only a GPU can run, for one lent GPU with no network (docs/gpu-smoke.md; v3: round four's steps).
#   scripts/gpu_smoke.sh OUT            run every step; one line per step in OUT/summary.txt, each step's log in OUT/
#   scripts/gpu_smoke.sh --dry-run OUT  list the steps (name, time limit, command) and run nothing (works on CPU)
#   scripts/gpu_smoke.sh --steps A,B OUT only those steps (a lent GPU's 10-minute calls: the smoke in two of them)
# The machine needs python3 with CUDA torch, transformers and peft; the rest travels as wheels in .whl/
# (scripts/gpu_wheels.sh fills it, measured size in docs/gpu-smoke.md), installed here into .whl/site with no index.
# Steps run most valuable first, each under its own `timeout`; a failed step does not stop the next. vLLM is not
# among them (its wheel is far over the 64 MiB that travels): the vLLM path needs a cluster node (docs/gpu-smoke.md).
set -uo pipefail
DRY=0
ONLY=""
while [ $# -gt 0 ]; do
  case $1 in --dry-run) DRY=1; shift ;; --steps) ONLY=",$2,"; shift 2 ;; *) break ;; esac
done
OUT=${1:?usage: scripts/gpu_smoke.sh [--dry-run] [--steps A,B,...] OUT}
PY=${PY:-python3}
TINY=(model=tiny dataset=toy_arith algorithm.n=4 algorithm.m=2 train.prompts_per_step=2 train.time_budget_s=null
      sampling.max_tokens=12 eval.at_start=false eval.every_s=null eval.max_examples=8 eval.repeats=1)
Z3_BASE=(hardware=h100x8_zero3 hardware.nproc_per_node=1 hardware.gpu_memory_gb=null hardware.micro_batch_size=4)
Z3=("${Z3_BASE[@]}" train.checkpoint_every_steps=1 train.keep_checkpoints=1 eval.suite=toy "hydra.run.dir=$OUT/zero3_run")
BENCH_TEST=tests/gpu/test_bench_gpu.py::test_cuda_mode_small  # runs benchmarks/bench_gpu.py --device cuda --small, then checks it
LORA=(hardware=l40s_lora rollout=hf hardware.gpu_memory_gb=null model.quantization=4bit train.max_steps=2 train.save_final=true
      "hydra.run.dir=$OUT/lora4bit_run")
ASYNC=(hardware=l40s_lora rollout=hf hardware.gpu_memory_gb=null model.quantization=4bit train.max_steps=3 train.max_staleness=1
       "hydra.run.dir=$OUT/async4bit_run")
BUDGET=(hardware.micro_batch_tokens=64 train.group_filter=nonzero_std train.refill_batches=1 algorithm.advantage=mean_centered
        algorithm.loss_agg=seq_mean_token_sum_norm "hydra.run.dir=$OUT/budget_run")

# name | seconds | command (one line; runs under bash -c in the repository root)
STEPS=(
  "env|25|$PY -m pods.gpu_env && $PY scripts/gpu_smoke_checks.py triton"
  "zero3_train|75|$PY -m torch.distributed.run --standalone --nproc_per_node 1 -m pods.train ${TINY[*]} ${Z3[*]} train.max_steps=2"
  "zero3_resume|65|$PY -m torch.distributed.run --standalone --nproc_per_node 1 -m pods.train ${TINY[*]} ${Z3[*]} train.max_steps=3 train.resume=auto && $PY scripts/gpu_smoke_checks.py steps $OUT/zero3_run 3"
  "lora4bit_merge|35|$PY scripts/gpu_smoke_checks.py lora_merge"
  "lora4bit_train|45|$PY -m pods.train ${TINY[*]} ${LORA[*]} && $PY scripts/gpu_smoke_checks.py steps $OUT/lora4bit_run 2"
  "export_4bit|45|$PY -m pods.export $OUT/lora4bit_run $OUT/lora4bit_export && $PY scripts/gpu_smoke_checks.py export $OUT/lora4bit_run $OUT/lora4bit_export"
  "zero3_accum|90|$PY -m torch.distributed.run --standalone --nproc_per_node 1 scripts/gpu_smoke_checks.py accum"
  "suite_child|75|$PY scripts/gpu_smoke_checks.py suite_child $OUT/suite_child_run"
  "async_lora4bit|60|$PY -m pods.train ${TINY[*]} ${ASYNC[*]} && $PY scripts/gpu_smoke_checks.py steps $OUT/async4bit_run 3"
  "zero3_budget|75|$PY -m torch.distributed.run --standalone --nproc_per_node 1 -m pods.train ${TINY[*]} ${Z3_BASE[*]} ${BUDGET[*]} train.max_steps=2 && $PY scripts/gpu_smoke_checks.py steps $OUT/budget_run 2"
  "pytest_gpu|130|$PY -m pytest -q -rfE --tb=short -m gpu tests/gpu -p no:cacheprovider --deselect $BENCH_TEST"
  "bench_gpu_small|195|$PY -m pytest -q -rfE --tb=short -m gpu $BENCH_TEST -p no:cacheprovider --basetemp $OUT/bench"
  "bench_step_cost|480|$PY benchmarks/bench_gpu.py --step-cost --device cuda --repeats 4 --out $OUT/step_cost"
)
if [ -n "$ONLY" ]; then  # keep the named steps, in their order
  KEPT=(); for s in "${STEPS[@]}"; do [[ "$ONLY" == *",${s%%|*},"* ]] && KEPT+=("$s"); done; STEPS=("${KEPT[@]}")
fi

if [ "$DRY" = 1 ]; then
  total=0; for s in "${STEPS[@]}"; do IFS='|' read -r _ t _ <<<"$s"; total=$((total + t)); done
  echo "gpu smoke: ${#STEPS[@]} steps, at most ${total} s, results in $OUT/summary.txt"
  for s in "${STEPS[@]}"; do IFS='|' read -r name limit cmd <<<"$s"; printf '%-16s %4ss  %s\n' "$name" "$limit" "$cmd"; done
  exit 0
fi

mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then  # the carried wheels, no index, no dependencies resolved
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .whl/site .whl/*.whl \
    > "$OUT/install.log" 2>&1 || { echo "install  FAIL  see install.log" > "$OUT/summary.txt"; exit 1; }
  export PYTHONPATH="$PWD/.whl/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
: > "$OUT/summary.txt"
fails=0
for s in "${STEPS[@]}"; do
  IFS='|' read -r name limit cmd <<<"$s"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" bash -c "$cmd" > "$OUT/$name.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  case $rc in 0) status=ok ;; 124|137) status="TIMEOUT(${limit}s)" ;; *) status="FAIL(rc=$rc)" ;; esac
  [ "$rc" = 0 ] || fails=$((fails + 1))
  last=$(grep -v '^\s*$' "$OUT/$name.log" | tail -1 | cut -c1-160)
  printf '%-16s %-14s %4ss  %s\n' "$name" "$status" "$took" "$last" | tee -a "$OUT/summary.txt"
done
echo "$fails of ${#STEPS[@]} steps failed" | tee -a "$OUT/summary.txt"
[ "$fails" = 0 ]
