"""Sweeps: a grid of experiment points, run in processes or on Dask into a resumable store."""
