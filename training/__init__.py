"""preflab training: reward models, GRPO/GSPO and PPO on exported preference data.

This package never imports `app/`: it reads export files and writes model directories
and `metrics.jsonl`, so it runs the same on a laptop or a GPU cluster.
"""
