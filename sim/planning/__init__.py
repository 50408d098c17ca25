"""Capacity planning on top of the runner and the results API: ``kvsim sweep`` and ``kvsim plan``.

It builds experiment configs, runs them through the runner in processes or on Dask, and reads results
back through ``sim.results``; it never reaches into a running engine. Two stories, one package each,
with the report below them; each of the three imports only those below it: plans, then sweeps, then
the report.

* :mod:`.plans`: a plan is a rate search per candidate, over sweep points.
  :mod:`~.plans.spec` (candidates, SLOs, search settings, probe configs), :mod:`~.plans.search` (the
  rate search and SLO verdicts), :mod:`~.plans.analysis` (max rate, binding limit, sizing, ranking),
  :mod:`~.plans.cluster_check`, :mod:`~.plans.plan_json` (plan.json), :mod:`~.plans.run`
  (``kvsim plan`` from Python: the searches, then plan.json and the report written).
* :mod:`.sweeps`: a sweep is a grid of points run into a resumable store.
  :mod:`~.sweeps.spec` (the sweep file, axes, points, validated before anything runs),
  :mod:`~.sweeps.preflight` (what can fail without simulating), :mod:`~.sweeps.tasks` (what a worker
  runs for one point), :mod:`~.sweeps.steady`, :mod:`~.sweeps.early_stop` and :mod:`~.sweeps.pools`
  (what a plan's probe point measures: its steady-state window, whether it reached a steady state,
  its stop once an SLO is certainly broken, a disaggregated deployment's pools),
  :mod:`~.sweeps.executors` (this process, local processes, Dask), :mod:`~.sweeps.store` (the point
  folders), :mod:`~.sweeps.driver` (points into the store), :mod:`~.sweeps.run` (``kvsim sweep``
  from Python).
* :mod:`.report`: drawn from tables and plan.json only, never from the sweeps' or plans' objects.
  :mod:`~.report.document` (a small document model rendered as Markdown and HTML),
  :mod:`~.report.plan_report` (plan.json rendered as report.md and report.html),
  :mod:`~.report.figures` (a sweep's and a plan's), :mod:`~.report.units` (numbers, labels).
* :mod:`.schema` (reading sweep/plan YAML, errors in kvsim's style, key-path overrides) serves both;
  :mod:`.cli` (the two subcommands) and :mod:`.reference` (the plan and sweep file references) stand
  above them.

Kept free of imports so that ``kvsim --help`` stays fast; import the modules themselves.
"""
