"""The KV coordinator, the engine's one door to KV memory: its interface (``sim/kv/interface.py``),
the one-group case (``sim/kv/single_group.py``) and several groups (``sim/kv/multi_group.py``), and
:func:`make_coordinator`, which picks between them. Every name importable from here before the
split still is."""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import KVCachePolicy, PolicyInputError
from policies.hybrid.group import GroupManager
from sim.kv.interface import Breakdown, KVCoordinator, KVGroup
from sim.kv.multi_group import MultiGroupCoordinator, group_token_sharing, longest_common_hit
from sim.kv.single_group import SingleGroupCoordinator

__all__ = [
    "Breakdown",
    "KVCoordinator",
    "KVGroup",
    "MultiGroupCoordinator",
    "SingleGroupCoordinator",
    "group_token_sharing",
    "longest_common_hit",
    "make_coordinator",
]


def make_coordinator(groups: Sequence[KVGroup] | KVCachePolicy) -> KVCoordinator:
    """The coordinator over ``groups`` (a bare policy is one group holding every layer)."""
    if isinstance(groups, KVCachePolicy):
        return SingleGroupCoordinator(KVGroup("full_attention", groups, groups.pool.kv_bytes_per_token))
    if not groups:
        raise PolicyInputError("a KV coordinator needs at least one KV group")
    if len(groups) == 1 and not isinstance(groups[0].policy, GroupManager):
        # (A group drawing on a shared pool reports only what it holds: the pool is the coordinator's.)
        return SingleGroupCoordinator(groups[0])
    return MultiGroupCoordinator(groups)
