"""How long an iteration takes: the cost-model interface with the analytic and measured-profile
models (``core``) and the derated roofline (``derated``)."""
