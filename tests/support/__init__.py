"""What the tests share (pytest puts tests/ on sys.path; pods/ never imports it): ``config`` (the composed,
shrunk config and the shared data), ``harness`` (ports, torchrun, two ranks vs one process), ``layers`` (the
package's layers), ``slurm_cluster`` (a local SLURM cluster), ``wandb_runs`` (runs in child processes). No test
module imports another test module."""
