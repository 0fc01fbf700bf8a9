"""pods: Policy Optimization with Down-Sampling (PODS), GRPO and GRPO-GA in one training loop.

Importing the package is cheap: heavy engines (vLLM, DeepSpeed) are imported only when a config names them.
"""

__version__ = "0.1.0"
