"""Evaluation: mean@k in the three inference modes, and evaluation during training."""
