"""Baselines the benchmarks compare machina-toolhost with, run in the same session."""
