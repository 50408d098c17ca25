"""Sim-to-real: measured serving runs replayed through kvsim's engine and compared request by request.

The flow, one way: a reader (``readers.py``) turns a measured run's files into a
:class:`~sim.replay.measured.MeasuredRun`; ``simulate.py`` writes it as a trace plus an experiment
and runs it with the same runner as ``kvsim run``; ``compare.py`` pairs the two per-request tables;
``report.py`` and ``figures.py`` render the comparison. ``pipeline.py`` strings them together for
``kvsim replay-run`` (``cli.py``).
"""
