"""Run files: checkpoints that are complete or absent, and the run's logs, plots and final model."""
