"""A cluster: replicas of the engine behind a router, all on one SimPy clock.

The cluster owns the request stream: it delivers each arrival (and each follow-up a finished request
produces: the next conversation turn, a closed-loop user's next request) to the replica its router
picks, through :meth:`Engine.submit`. A replica plans its event-skipping jumps with
:meth:`Cluster.arrival_bound`: the next known arrival and, when the workload has follow-ups, the
end of every other replica's wake-up in flight (a follow-up is born at a completion, which only
happens at the end of a wake-up), so a request routed to a replica never lands inside one of its
jumps and a cluster gives the same results in both step modes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import simpy

from sim.cluster.routers import Router
from sim.engine.arrivals import Arrivals
from sim.engine.core import Engine
from sim.engine.gc_tuning import fewer_collections
from workloads.base import Workload
from workloads.request import Request

ReplicaBuilder = Callable[[int, simpy.Environment, Callable[[], float], Callable | None], Engine]
"""``(index, env, upstream, follow_up) -> Engine``: one replica on the cluster's clock."""


def follow_up_of(workload: Workload) -> Callable | None:
    """The workload's follow-up hook, or None when it never produces one (replicas can jump further)."""
    return workload.follow_up if type(workload).follow_up is not Workload.follow_up else None


class Cluster:
    def __init__(
        self,
        replicas: int,
        build_replica: ReplicaBuilder,
        router: Router,
        requests: Iterator[Request],
        follow_up: Callable | None = None,
        on_delivered: Callable[[int], None] | None = None,
    ):
        self.env = simpy.Environment()
        self.router = router
        self._arrivals = Arrivals(self.env, requests, self._route, on_delivered=on_delivered)
        self._follow_up = follow_up
        hook = self._on_request_done if follow_up is not None else None
        self.replicas: list[Engine] = [
            build_replica(index, self.env, self._bound_for(index), hook) for index in range(replicas)
        ]
        if router.reads_kv_state:
            for replica in self.replicas:
                replica.let_arrivals_read_kv_state()
        self.routed = [0] * replicas  # requests each replica received

    def run(self, until_s: float | None = None) -> None:
        self.env.process(self._arrivals.process())
        for replica in self.replicas:
            replica.start()
        with fewer_collections():  # (the replicas' tables too: sim/engine/core.py, Engine.run)
            self.env.run(until=until_s)
            for replica in self.replicas:
                replica.finish()

    # ------------------------------------------------------------------------------------ arrivals
    def _route(self, request: Request) -> None:
        index = self.router.choose(request, self.replicas)
        self.routed[index] += 1
        self.replicas[index].submit(request)

    def _on_request_done(self, request: Request, now: float) -> None:
        """A replica's request reached its outcome: its follow-up (if any) is routed when it arrives."""
        assert self._follow_up is not None
        follow = self._follow_up(request, now)
        if follow is not None:
            self._arrivals.schedule_follow_up(follow)
        return None  # the replica schedules nothing itself

    # --------------------------------------------------------------------------------- jump bounds
    def _bound_for(self, index: int) -> Callable[[], float]:
        return lambda: self.arrival_bound(index)

    def arrival_bound(self, index: int) -> float:
        """The earliest time a request not yet delivered could reach replica ``index``."""
        times = [self._arrivals.next_arrival_s()]
        if self._follow_up is not None:
            times += [replica.busy_until for other, replica in enumerate(self.replicas) if other != index]
        return min(times)
