"""The engine layer: a SimPy model of one GPU's continuous-batching engine (``core``), its
decode bookkeeping (``decoding``) and the closed-form arithmetic of event skipping (``event_skip``).
It knows KV-cache policies only through ``policies.base.KVCachePolicy``."""
