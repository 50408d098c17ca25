"""What a run leaves behind: the recorder and counters (``metrics``), where rows go while it runs
(``sinks``), the column dictionary (``columns``), rejection outcomes (``outcomes``) and the canvas
figures are drawn on (``canvas``). The figures of a run, which read the results API, are
``sim.figures``, above it."""
