"""Routers: which replica of a cluster each arriving request goes to.

A router sees the replicas' engines as they are at the request's arrival instant (the simulated
state, read without changing it) and returns a replica index. Ties go to the lowest index, so a run
is deterministic. The load of a replica is its running + waiting requests, as the queue scorers of
llm-d and the SGLang router count it.

``prefix_aware`` follows llm-d's scheduler (a weighted sum of scorers, the highest total wins; its
default profile weighs the prefix-cache scorer 3 and the queue scorer 2 [1]):

    score(replica) = prefix_weight x hit_tokens / prompt_tokens
                   + load_weight x (max_load - load) / (max_load - min_load)   (1 when all loads are equal)

``hit_tokens`` is the prefix the replica's policy would serve from its cache right now, through the
policy's side-effect-free ``lookup()`` (exact, where llm-d estimates it from KV events or a
router-side index: an upper bound of what a real router knows). When the hits tie, the prefix term is
the same for every replica and the load decides.

[1] Red Hat OpenShift AI, "Configuring scheduler settings for LLM inference services" (llm-d's
    EndpointPicker default profile: queue scorer weight 2, prefix-cache scorer weight 3);
    llm-d docs, architecture/core/router/epp/scheduling (filter -> score -> pick).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from sim.config import ClusterConfig

if TYPE_CHECKING:
    from sim.engine.core import Engine
    from workloads.request import Request


def load_of(engine: Engine) -> int:
    """Requests a replica holds: running + waiting."""
    return len(engine.running) + len(engine.waiting)


def least_loaded(replicas: Sequence[Engine]) -> int:
    loads = [load_of(engine) for engine in replicas]
    return loads.index(min(loads))


class Router(ABC):
    name: ClassVar[str]
    needs_prefix_lookup: ClassVar[bool] = False

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


class LeastKV(Router):
    """The replica with the most free KV slots (evictable cached blocks count as free, as in vLLM's
    ``kv_cache_usage_perc``), as the policy reports them at the arrival instant. With
    ``step_mode: skip`` the blocks a replica takes inside an event-skipping jump are booked when the
    jump ends, so an arrival during a jump's last iteration can see a few blocks more free than
    single steps would (a real router reads scraped metrics, staler still)."""

    name = "least_kv"

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        free = [engine.policy.available_slots() for engine in replicas]
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

    def __init__(self, prefix_weight: float, load_weight: float) -> None:
        self.prefix_weight = prefix_weight
        self.load_weight = load_weight

    def scores(self, request: Request, replicas: Sequence[Engine]) -> list[float]:
        prompt_tokens = request.prompt_len
        hits = [engine.policy.lookup(request.prompt).cached_tokens for engine in replicas]
        loads = [load_of(engine) for engine in replicas]
        low, high = min(loads), max(loads)
        return [
            self.prefix_weight * (hit / prompt_tokens if prompt_tokens else 0.0)
            + self.load_weight * ((high - load) / (high - low) if high > low else 1.0)
            for hit, load in zip(hits, loads, strict=True)
        ]

    def choose(self, request: Request, replicas: Sequence[Engine]) -> int:
        scores = self.scores(request, replicas)
        return scores.index(max(scores))


ROUTER_CLASSES: dict[str, type[Router]] = {
    cls.name: cls for cls in (RoundRobin, LeastRequests, LeastKV, SessionAffinity, PrefixAware)
}


def make_router(config: ClusterConfig) -> Router:
    if config.router == PrefixAware.name:
        return PrefixAware(config.prefix_weight, config.load_weight)
    return ROUTER_CLASSES[config.router]()
