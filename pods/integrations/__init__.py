"""pods' algorithm inside other trainers: ``pods.integrations.kept`` (the selection on a flat batch of rollouts, torch
only) and ``pods.integrations.trl`` (PODS in TRL's ``GRPOTrainer``; needs ``pip install 'pods[trl]'``). docs/integrations.md."""
