"""Several engine replicas behind a router, simulated on one clock (the ``cluster:`` config section)."""
