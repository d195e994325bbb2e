"""The training loop behind `train.py`: configs, optimizer, checkpoints, logging, DDP."""
