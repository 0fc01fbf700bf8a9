"""The training loop: GRPO, GRPO-GA, GRPO-PODS and D3S are one loop with different config values.

``train(cfg, run_dir)`` runs one experiment from a validated config (``pods.config.validate``):
  (0) a resume checked against the run's own record (``pods.resume``: exact or refused; a finished run is left as it
  is), and the run set up (``Run``); then, until the step or time budget is spent, each step
  (1) samples this rank's prompts, (2) generates n rollouts per prompt, (3) scores them, (3b) drops groups of equal
  rewards and refills from further prompt batches (``train.group_filter``), (4) down-samples to the plan's kept count
  per group with the named rule, (5) computes advantages on the kept rollouts (D3S: on the full group, before (4), and
  the rule reads them), (5b) applies token-level corrections and selection, (6) updates the policy, (7) syncs the
  weights into the engine, (8) logs, (9) evaluates on the training clock's schedule and (10) checkpoints. At the end:
  a last evaluation, the final checkpoint or weights.

The modules are the stages, and typed records cross between them:
- ``rollouts``: (1)-(5) for every run, ``prepare(Generation, Source, progress) -> Ready`` (the ``Rows`` this rank
  trains, and what these steps measured: ``Produced``);
- ``learn``: (5b)-(7), ``learn(Trainer, Ready, lr, progress) -> Learned``, and ``step_row``: the step's metrics row,
  merged once;
- ``run``: ``Run`` (the parts, (8)-(10), the end), ``LoopState``, ``train``;
- ``producer``: the background thread of ``train.max_staleness: k >= 1`` (docs/async.md), which runs (1)-(5) ahead
  while (5b)-(7) update on the batch generated k policy versions before; it owns its ``Source`` and never sees the
  ``Run``; a checkpoint drains it. 0 (default): no thread.

GRPO is rule ``all`` with m = n; GRPO-GA keeps all n and trains them in micro-batches of m with one optimizer
step; PODS keeps m of n (``pods.plan`` holds the plan). The training clock (``train_time``) excludes evaluation
and checkpointing, so curves of accuracy against training time compare algorithms fairly.

Several processes (``torchrun --nproc_per_node N -m pods.train hardware=h100x8_zero3 ...``): each rank runs this
same loop on its own ``train.prompts_per_step`` prompts, with its own engine; a prompt group never spans ranks, so
(4)-(5) are per rank (a whole-step rule, ``d3s_cross_step``, gathers the advantages and moves the kept rows so that
every rank trains an equal share: ``Rows.take``); the backend reduces gradients in (6). ``pods.distributed`` keeps the
clock and the stop decision identical on every rank and reduces what is logged; only rank 0 writes files.
"""

from pods.loop.run import LoopState, Run, rollout_step, train

__all__ = ["LoopState", "Run", "rollout_step", "train"]
