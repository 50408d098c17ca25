"""The engine layer: a SimPy model of one GPU's continuous-batching engine (``core``), its
decode bookkeeping (``decoding``), the closed-form arithmetic of event skipping (``event_skip``) and
the requests not yet delivered (``arrivals``, shared with ``sim/cluster/``).
It reaches KV memory only through the KV coordinator (``sim.kv.coordinator.KVCoordinator``), which
holds one ``policies.base.KVCachePolicy`` per KV group."""
