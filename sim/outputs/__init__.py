"""What a run leaves behind: the recorder and counters (``metrics``), where rows go while it runs
(``sinks``), the column dictionary (``columns``), rejection outcomes (``outcomes``) and figures
(``plots``)."""
