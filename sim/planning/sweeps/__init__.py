"""Sweeps: a grid of experiment points, run in processes or on Dask into a resumable store.

A point may be a plan's probe: it then measures its steady-state window and may stop early (here, with
the task that runs it, since the plans stand above the sweeps)."""
