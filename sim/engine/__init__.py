"""The engine layer: a SimPy model of one GPU's continuous-batching engine (``core``), its
decode bookkeeping (``decoding``), the closed-form arithmetic of event skipping (``event_skip``) and
the requests not yet delivered (``arrivals``, shared with ``sim/cluster/``).
It knows KV-cache policies only through ``policies.base.KVCachePolicy``."""
