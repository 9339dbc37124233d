"""Grids of runs (`lanpo experiment`) and the statistics of their tables."""
