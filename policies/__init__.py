"""KV-cache allocation policies. Importing the package registers every policy by name.

The token content they store (prompts as segments) is :mod:`token_content`'s, not theirs.
"""

import sim  # noqa: F401, I001  (first: it activates the compiled build of the policies, if any)
from policies import contiguous as _contiguous  # noqa: F401  (registers "contiguous")
from policies import paged as _paged  # noqa: F401  (registers "paged")
from policies import prefix as _prefix  # noqa: F401  (registers "prefix")
from policies import radix as _radix  # noqa: F401  (registers "radix")
from policies.base import (
    ChildSpec,
    KVCachePolicy,
    MemoryBreakdown,
    OutOfKVMemory,
    PolicyError,
    PolicyInputError,
    PolicyStats,
    PoolSpec,
    make_policy,
    policy_names,
)

__all__ = [
    "ChildSpec",
    "KVCachePolicy",
    "MemoryBreakdown",
    "OutOfKVMemory",
    "PolicyError",
    "PolicyInputError",
    "PolicyStats",
    "PoolSpec",
    "make_policy",
    "policy_names",
]
