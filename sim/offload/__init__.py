"""The host-memory tier for cached KV blocks (``offload:`` in an experiment YAML).

Cached blocks the GPU evicts go to a host LRU pool instead of vanishing; a later prefix hit there is
loaded back (``policies/_host_tier.py`` holds the tier, the prefix policy uses it). This module holds
the config section, the tier's size in blocks, and the time a load takes.

Timing choices (documented simplifications):

- A load (host -> GPU) is charged to the iteration that admits the request, the way swap-ins and
  copy-on-write copies are: ``blocks x block bytes / bandwidth``, on top of the forward pass. vLLM's
  offloading connector loads asynchronously (the request waits in ``WAITING_FOR_REMOTE_KVS`` while
  the batch runs on), so kvsim's charge is the pessimistic bound for the rest of the batch and exact
  for the loading request.
- Offload writes (GPU -> host, at eviction) cost no iteration time: vLLM's connector stores on a side
  stream while the model runs (``wait_for_save`` -> ``prepare_store_kv``) and SGLang HiCache writes
  back asynchronously too. Their bytes are counted (``host_offload_bytes``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import ConfigDict, Field

from policies._host_tier import HostTierStats
from policies.base import KVCachePolicy
from sim.costs.core import CostModel
from sim.kv.coordinator import KVCoordinator
from workloads.config_base import ConfigModel

GIB = 1024**3


class OffloadConfig(ConfigModel):
    """``offload:``: keep cached KV the GPU evicts in host memory (the prefix policy's host tier, the
    radix policy's HiCache)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)

    host_memory_gib: float = Field(gt=0)
    """Host memory for evicted cached blocks, in GiB (2^30 bytes) per engine. The tier holds
    ``floor(host bytes / (kv_bytes_per_token x block_size))`` blocks."""
    bandwidth_gb_per_s: float | None = Field(default=None, gt=0)
    """Host <-> GPU transfer bandwidth in 10^9 bytes/s. Default: the link swaps use (the cost model's
    host link: `cost_model.host_bandwidth_gb_per_s`, else one direction of the GPU preset's PCIe link,
    e.g. 32 GB/s on an A100; or a profile's measured swap times)."""
    policy: Literal["lru"] = "lru"
    """Which host entry makes room: the least recently stored or hit (vLLM's `LRUOffloadingManager`;
    SGLang HiCache's `evict_host`)."""
    write_policy: Literal["write_through", "write_through_selective", "write_back"] | None = None
    """When GPU content is copied to host memory (SGLang's `--hicache-write-policy`): `write_through`
    when a radix node is inserted, `write_through_selective` at its second hit, `write_back` when the
    GPU evicts it. Default: the policy's own (`write_through` for radix, SGLang's; the prefix policy
    writes back on eviction only, and takes no other)."""


def host_tier_blocks(config: OffloadConfig, block_bytes: int) -> int:
    """Blocks the host tier holds: whole blocks in ``host_memory_gib``."""
    return int(config.host_memory_gib * GIB // block_bytes)


def host_load_seconds(config: OffloadConfig, costs: CostModel, block_bytes: int) -> Callable[[float], float]:
    """Seconds to load ``n`` blocks from the host tier: over ``bandwidth_gb_per_s`` when set, else as
    the cost model times a swap of ``n`` blocks (the same host link)."""
    if config.bandwidth_gb_per_s is None:
        return costs.swap_blocks_s
    per_block_s = block_bytes / (config.bandwidth_gb_per_s * 1e9)
    return lambda blocks: blocks * per_block_s


def host_tier_summary(
    policies: Sequence[KVCachePolicy | KVCoordinator], block_bytes: int, host_load_s: float
) -> dict[str, Any]:
    """The host tier's summary columns (``sim/outputs/columns.py``) over ``policies`` (one engine's, or every
    replica's of a cluster, each with its own tier), summed; zeros without a tier."""
    tiers = [policy.host_tier for policy in policies if policy.host_tier is not None]
    stats = [tier.stats for tier in tiers] or [HostTierStats()]
    capacity_blocks = sum(tier.capacity_blocks for tier in tiers)
    queries = sum(policy.stats.prefix_cache_queries for policy in policies)
    gpu_hits = sum(policy.stats.prefix_cache_hits for policy in policies)
    host_hits = sum(item.host_cache_hits for item in stats)
    loaded = sum(item.host_loaded_blocks for item in stats)
    offloaded = sum(item.host_offloaded_blocks for item in stats)
    return {
        "host_tier_blocks": capacity_blocks,
        "host_tier_bytes": capacity_blocks * block_bytes,
        "host_cache_hits": host_hits,
        "host_cache_hit_rate": host_hits / queries if queries else None,
        "total_cache_hit_rate": (gpu_hits + host_hits) / queries if queries else None,
        "host_loaded_blocks": loaded,
        "host_load_bytes": loaded * block_bytes,
        "host_load_s": host_load_s,
        "host_offloaded_blocks": offloaded,
        "host_offload_bytes": offloaded * block_bytes,
        "host_evictions": sum(item.host_evictions for item in stats),
        "host_cached_tokens_end": sum(policy.host_breakdown_values()[0] for policy in policies),
    }
