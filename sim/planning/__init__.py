"""Capacity planning on top of the runner and the results API: ``kvsim sweep`` and ``kvsim plan``.

It builds experiment configs, runs them through the runner in processes or on Dask, and reads results
back through ``sim.results``; it never reaches into a running engine. Two stories, one package each,
with the report beside them:

* :mod:`.sweeps`: a sweep is a grid of points run into a resumable store.
  :mod:`~.sweeps.spec` (the sweep file, axes, points, validated before anything runs),
  :mod:`~.sweeps.preflight` (what can fail without simulating), :mod:`~.sweeps.tasks` (what a worker
  runs for one point), :mod:`~.sweeps.executors` (this process, local processes, Dask),
  :mod:`~.sweeps.store` (the point folders), :mod:`~.sweeps.driver` (points into the store),
  :mod:`~.sweeps.run` (``kvsim sweep`` from Python).
* :mod:`.plans`: a plan is a rate search per candidate, over sweep points.
  :mod:`~.plans.spec` (candidates, SLOs, search settings, probe configs), :mod:`~.plans.steady`
  (the steady-state window and whether a probe reached it), :mod:`~.plans.search` (the rate search
  and SLO verdicts), :mod:`~.plans.analysis` (max rate, binding limit, sizing, ranking),
  :mod:`~.plans.cluster_check`, :mod:`~.plans.run` (``kvsim plan`` from Python).
* :mod:`.report`: :mod:`~.report.document` (a small document model rendered as Markdown and HTML),
  :mod:`~.report.plan_report` (plan.json, report.md, report.html), :mod:`~.report.figures`,
  :mod:`~.report.units`.
* :mod:`.schema` (reading sweep/plan YAML, errors in kvsim's style, key-path overrides) and
  :mod:`.cli` (the two subcommands) serve both.

Kept free of imports so that ``kvsim --help`` stays fast; import the modules themselves.
"""
