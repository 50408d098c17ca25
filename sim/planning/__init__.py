"""Capacity planning on top of the runner and the results API: ``kvsim sweep`` and ``kvsim plan``.

It builds experiment configs, runs them through the runner in processes or on Dask, and reads results
back through ``sim.results``; it never reaches into a running engine. A plan is a search over sweep
points; a report is a rendering of ``plan.json``. The modules, in the order a run goes through them:

* :mod:`.schema`: reading sweep/plan YAML, errors in kvsim's style, key-path overrides;
* :mod:`.spec`: the sweep file, axis expansion, points (validated before anything runs);
* :mod:`.plan_spec`: the plan file: candidates, SLOs, search settings, probe configs;
* :mod:`.preflight`: what can fail without simulating (hardware, pool, policy options, files);
* :mod:`.tasks`: what a worker runs for one point; :mod:`.steady`: the steady-state window;
* :mod:`.executors`: this process, local processes, Dask; :mod:`.store`: the resumable point folders;
* :mod:`.driver`: running points into the store; :mod:`.sweep`: ``kvsim sweep`` from Python;
* :mod:`.search`: the rate search and SLO verdicts; :mod:`.analysis`: max rate, binding limit, sizing;
* :mod:`.plan`: ``kvsim plan`` from Python; :mod:`.report`, :mod:`.document`, :mod:`.figures`,
  :mod:`.units`: plan.json, report.md and report.html;
* :mod:`.cli`: the two subcommands.

Kept free of imports so that ``kvsim --help`` stays fast; import the modules themselves.
"""
