"""Routers: which replica of a cluster each arriving request goes to.

A router sees the replicas' engines as they are at the request's arrival instant (the simulated
state, read without changing it) and returns a replica index. Ties go to the lowest index, so a run
is deterministic. The load of a replica is its running + waiting requests, as the queue scorers of
llm-d and the SGLang router count it.

``prefix_aware`` follows llm-d's scheduler (a weighted sum of scorers, the highest total wins; its
default profile weighs the prefix-cache scorer 3 and the queue scorer 2 [1]):

    score(replica) = prefix_weight x (gpu_hit_tokens + host_weight x host_hit_tokens) / prompt_tokens
                   + load_weight x (max_load - load) / (max_load - min_load)   (1 when all loads are equal)

``gpu_hit_tokens`` is the prefix the replica's policy would serve from its GPU cache right now, and
``host_hit_tokens`` the continuation its host-memory tier would load back (``offload:``; 0 without
one), both through the policy's side-effect-free ``lookup()`` (exact, where llm-d estimates them from
KV events or a router-side index: an upper bound of what a real router knows). A block held in host
memory counts ``host_weight`` (default 0.8) of a block on the GPU, as llm-d's KV-block index weighs
its GPU and CPU tiers 1.0 and 0.8 [2]: a host hit still saves the prefill, but costs a load. When the
hits tie, the prefix term is the same for every replica and the load decides.

[1] Red Hat OpenShift AI, "Configuring scheduler settings for LLM inference services" (llm-d's
    EndpointPicker default profile: queue scorer weight 2, prefix-cache scorer weight 3);
    llm-d docs, architecture/core/router/epp/scheduling (filter -> score -> pick).
[2] llm-d kv-cache-manager architecture (KV-block index: blocks tagged by device tier, GPU 1.0 and
    CPU 0.8; a block in both tiers counts once, at the higher weight).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from sim.config import ClusterConfig

if TYPE_CHECKING:
    from policies.base import PrefixHit
    from sim.engine.core import Engine
    from workloads.request import Request


def load_of(engine: Engine) -> int:
    """Requests a replica holds: running + waiting (+ receiving their KV, in a disaggregated decode pool)."""
    return len(engine.running) + len(engine.waiting) + len(engine.receiving)


def least_loaded(replicas: Sequence[Engine]) -> int:
    loads = [load_of(engine) for engine in replicas]
    return loads.index(min(loads))


class Router(ABC):
    name: ClassVar[str]
    needs_prefix_lookup: ClassVar[bool] = False
    reads_kv_state: ClassVar[bool] = False
    """Whether :meth:`choose` reads the replicas' KV pools (free slots, cached prefixes): their
    event-skipping jumps then stop before any arrival (``Engine.let_arrivals_read_kv_state``)."""

    @abstractmethod
    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        """The index of the replica ``request`` goes to."""


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        index = self._next % len(replicas)
        self._next += 1
        return index


class LeastRequests(Router):
    name = "least_requests"

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        return least_loaded(replicas)


class VllmDataParallel(Router):
    """vLLM's own balancer of a data-parallel server's ranks (``DPLBAsyncMPClient``,
    ``get_core_engine_for_request``): the rank with the lowest ``4 x waiting + running`` (a waiting
    request weighs four running ones), ties to the lowest index. vLLM reads the counts its DP
    coordinator publishes every 100 ms, adding locally the requests it has sent since; here they are
    exact at the arrival instant."""

    name = "vllm_dp"

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        scores = [WAITING_WEIGHT * len(engine.waiting) + len(engine.running) for engine in replicas]
        return scores.index(min(scores))


WAITING_WEIGHT = 4
"""vLLM's data-parallel balancer: ``score = waiting * 4 + running`` (``vllm/v1/engine/core_client.py``)."""


class LeastKV(Router):
    """The replica with the most free KV slots (evictable cached blocks count as free, as in vLLM's
    ``kv_cache_usage_perc``), as the policy reports them at the arrival instant: with the blocks taken
    at the start of the iteration in progress, in either step mode (``reads_kv_state``). A real
    router reads scraped metrics, staler than that."""

    name = "least_kv"
    reads_kv_state = True

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        free = [engine.kv.available_slots() for engine in replicas]
        return free.index(max(free))


class SessionAffinity(Router):
    """A session (conversation, user) stays on the replica its first request went to; a new session,
    or a request without one, goes to the least loaded replica."""

    name = "session_affinity"

    def __init__(self) -> None:
        self._replica_of: dict[int, int] = {}

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        if request.session_id is None:
            return least_loaded(replicas)
        if request.session_id not in self._replica_of:
            self._replica_of[request.session_id] = least_loaded(replicas)
        return self._replica_of[request.session_id]


class PrefixAware(Router):
    name = "prefix_aware"
    needs_prefix_lookup = True
    reads_kv_state = True

    def __init__(self, prefix_weight: float, load_weight: float, host_weight: float = 0.8) -> None:
        self.prefix_weight = prefix_weight
        self.load_weight = load_weight
        self.host_weight = host_weight

    def scores(self, request: Request, replicas: Sequence[Engine]) -> list[float]:
        prompt_tokens = request.prompt_len
        hits = [self._weighted_hit(engine.kv.lookup(request.prompt)) for engine in replicas]
        loads = [load_of(engine) for engine in replicas]
        low, high = min(loads), max(loads)
        return [
            self.prefix_weight * (hit / prompt_tokens if prompt_tokens else 0.0)
            + self.load_weight * ((high - load) / (high - low) if high > low else 1.0)
            for hit, load in zip(hits, loads, strict=True)
        ]

    def _weighted_hit(self, hit: PrefixHit) -> float:
        # The host continuation starts where the GPU hit ends, so no block counts in both tiers.
        return hit.cached_tokens + self.host_weight * hit.host_tokens

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        scores = self.scores(request, replicas)
        return scores.index(max(scores))


ROUTER_CLASSES: dict[str, type[Router]] = {
    cls.name: cls
    for cls in (RoundRobin, LeastRequests, VllmDataParallel, LeastKV, SessionAffinity, PrefixAware)
}


def make_router(config: ClusterConfig) -> Router:
    return make_router_named(config.router, config)


def make_router_named(name: str, weights: ClusterConfig) -> Router:
    """Router ``name``; a prefix_aware one with the weights of ``weights`` (a disaggregated pool's
    router takes its cluster's)."""
    if name == PrefixAware.name:
        return PrefixAware(weights.prefix_weight, weights.load_weight, weights.host_weight)
    return ROUTER_CLASSES[name]()
