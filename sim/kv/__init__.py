"""The KV coordinator: the engine's one door to KV memory, over one allocation policy per KV group.

``sim/engine`` asks a :class:`~sim.kv.coordinator.KVCoordinator` to look up, admit, grow, fork and
free sequences; the coordinator owns the list of KV groups (layers of one kind, each managed by one
``policies`` allocator), the rule that a prefix hit is the longest prefix every group can serve, and
the per-group accounting. Layering: engine -> kv -> policies (``[tool.importlinter]``).
"""
