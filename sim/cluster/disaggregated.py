"""Disaggregated prefill and decode: two pools of replicas on one clock, each request's KV sent between.

A request's life (the order vLLM's P/D connectors and llm-d follow):

1. On arrival the decode pool's router picks its decode replica, and the decider whether it is
   disaggregated at all (``always``, or only when the prompt tokens that replica does not hold cached
   exceed a threshold: llm-d's pd-profile-handler). A request that is not goes to its decode replica as
   to any replica, and is prefilled there.
2. The prefill pool's router picks a prefill replica, which runs the prompt (chunked prefill and
   prefix caching as always) and samples a first token that the client never sees. Its blocks stay
   held.
3. The decode replica allocates the prompt's blocks as an admission of its own (FCFS, its own memory):
   while it cannot, the request waits there and its prefill blocks stay held, which is how a full
   decode pool pushes back on the prefill pool.
4. The blocks the decode replica does not hold cached cross the link (``sim/cluster/link.py``); when
   the last byte is there the prefill replica frees its blocks (into its prefix cache) and the decode
   replica runs the request, computing its last prompt token to sample the first output token, which
   the client gets (vLLM's decode side recomputes that token: ``num_computed_tokens = len - 1``).

TTFT is split in the requests table: ``queue_s`` (prefill queue), ``prefill_s``, ``transfer_wait_s``
(back-pressure), ``transfer_s``, and the rest (``first_token_s - transfer_end_s``: the decode replica's
wait for its next iteration and that iteration).

Event skipping stays exact: a replica bounds its jumps (``upstream()``) by the next arrival, by every
other replica's wake-up end (handoffs, like follow-ups, happen only there), by the link's earliest
possible transfer end, and, for a prefill replica holding blocks whose transfer has not started, by
now (a decode replica may allocate them at this very instant, after this replica planned).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import simpy

from sim.cluster.link import LinkSpec, TransferLink
from sim.cluster.routers import Router
from sim.config import DeciderConfig
from sim.engine.arrivals import Arrivals
from sim.engine.core import Engine
from sim.engine.decoding import RequestState
from sim.engine.gc_tuning import fewer_collections
from sim.outputs.metrics import RequestRecord
from workloads.request import Request

DisaggregatedReplicaBuilder = Callable[..., Engine]
"""``(index, role, env, upstream, follow_up, transfer) -> Engine``; role "prefill" or "decode"."""


@dataclass(frozen=True)
class PoolShape:
    """What the cluster needs to know of a pool's replicas to size their transfers."""

    replicas: int
    block_size: int
    kv_bytes_per_token: int  # per GPU
    tensor_parallel_size: int


@dataclass
class Flight:
    """A disaggregated request between its arrival and the end of its transfer."""

    request: Request
    record: RequestRecord
    prefill: int
    decode: int
    prefill_state: RequestState | None = None
    decode_state: RequestState | None = None


def prefill_request(request: Request) -> Request:
    """What the prefill replica runs: the prompt, one token out (the samples fork on the decode side)."""
    return replace(request, output_len=1, n=1, beam_width=1, sample_output_lens=())


class Decider:
    def __init__(self, config: DeciderConfig):
        self.config = config

    @property
    def needs_prefix_lookup(self) -> bool:
        return self.config.mode == "prefix_threshold"

    def disaggregate(self, request: Request, decode_replica: Engine) -> bool:
        if self.config.mode == "always":
            return True
        cached = decode_replica.kv.lookup(request.prompt).total_tokens
        return request.prompt_len - cached > self.config.threshold_tokens


class DisaggregatedCluster:
    def __init__(
        self,
        prefill: PoolShape,
        decode: PoolShape,
        build_replica: DisaggregatedReplicaBuilder,
        routers: tuple[Router, Router],
        decider: Decider,
        link: LinkSpec,
        requests: Iterator[Request],
        follow_up: Callable | None = None,
        on_delivered: Callable[[int], None] | None = None,
    ):
        self.env = simpy.Environment()
        self.prefill_shape, self.decode_shape = prefill, decode
        self.prefill_router, self.decode_router = routers
        self.decider = decider
        self.link = TransferLink(self.env, link, on_change=self._log)
        # (time_s, requests whose prompt is done and which wait for their decode replica's blocks,
        # transfers in flight, bytes in flight) at every change.
        self.rows: list[tuple[float, int, int, float]] = [(0.0, 0, 0, 0.0)]
        self._arrivals = Arrivals(self.env, requests, self._route, on_delivered=on_delivered)
        self._follow_up = follow_up
        hook = self._on_request_done
        self.replicas: list[Engine] = []
        for index in range(prefill.replicas + decode.replicas):
            role = "prefill" if index < prefill.replicas else "decode"
            self.replicas.append(build_replica(index, role, self.env, self._bound_for(index), hook, self))
        self.prefill_replicas = self.replicas[: prefill.replicas]
        self.decode_replicas = self.replicas[prefill.replicas :]
        for router, pool in (
            (self.prefill_router, self.prefill_replicas),
            (self.decode_router, self.decode_replicas),
        ):
            if router.reads_kv_state:
                for replica in pool:
                    replica.let_arrivals_read_kv_state()
        self.routed = [0] * len(self.replicas)  # requests routed to each replica (a prompt, or a request)
        self.disaggregated = 0
        self.flights: dict[int, Flight] = {}
        # Per prefill replica, its held requests whose transfer has not started.
        self._unsent = [0] * prefill.replicas

    def run(self, until_s: float | None = None) -> None:
        self.env.process(self._arrivals.process())
        for replica in self.replicas:
            replica.start()
        with fewer_collections():  # (the replicas' tables too: sim/engine/core.py, Engine.run)
            self.env.run(until=until_s)
            for replica in self.replicas:
                replica.finish()

    def role_of(self, index: int) -> str:
        return "prefill" if index < self.prefill_shape.replicas else "decode"

    # ------------------------------------------------------------------------------------ arrivals
    def _route(self, request: Request) -> None:
        decode_index = self.prefill_shape.replicas + self.decode_router.choose(request, self.decode_replicas)
        decode = self.replicas[decode_index]
        record = decode.new_record(request)
        if not self.decider.disaggregate(request, decode):
            self.routed[decode_index] += 1
            decode.submit(request, record)
            return
        prefill_index = self.prefill_router.choose(request, self.prefill_replicas)
        self.routed[prefill_index] += 1
        self.routed[decode_index] += 1
        self.disaggregated += 1
        record.prefill_replica = prefill_index
        self.flights[request.request_id] = Flight(request, record, prefill_index, decode_index)
        self.replicas[prefill_index].submit(prefill_request(request), record)

    def _on_request_done(self, request: Request, now: float) -> None:
        """A request reached its outcome on some replica (a prefill replica's only by rejection)."""
        flight = self.flights.get(request.request_id)
        if flight is not None and flight.prefill_state is None:
            del self.flights[request.request_id]  # rejected by the prefill replica
        if self._follow_up is not None:
            original = flight.request if flight is not None else request
            follow = self._follow_up(original, now)
            if follow is not None:
                self._arrivals.schedule_follow_up(follow)

    # ----------------------------------------------------------------------- KV transfer (hooks)
    def prefilled(self, state: RequestState) -> None:
        flight = self.flights[state.request.request_id]
        flight.prefill_state = state
        self._unsent[flight.prefill] += 1
        self._log()
        self.replicas[flight.decode].submit_remote(flight.request, flight.record)

    def kv_allocated(self, state: RequestState, cached_tokens: int) -> None:
        flight = self.flights[state.request.request_id]
        flight.decode_state = state
        self._unsent[flight.prefill] -= 1
        block_size = self.decode_shape.block_size
        blocks = -(-state.request.prompt_len // block_size) - cached_tokens // block_size
        # The whole model's KV of those blocks: each prefill rank holds 1/TP of it and sends its share.
        nbytes = (
            blocks
            * block_size
            * self.prefill_shape.kv_bytes_per_token
            * self.prefill_shape.tensor_parallel_size
        )
        flight.record.transfer_bytes = nbytes
        lanes = min(self.prefill_shape.tensor_parallel_size, self.decode_shape.tensor_parallel_size)
        self.link.send(nbytes, flight.prefill, flight.decode, lanes, lambda: self._landed(flight))

    def remote_dropped(self, state: RequestState) -> None:
        flight = self.flights.pop(state.request.request_id)
        self._unsent[flight.prefill] -= 1
        self._log()
        assert flight.prefill_state is not None
        self.replicas[flight.prefill].release_held(flight.prefill_state)

    def _landed(self, flight: Flight) -> None:
        del self.flights[flight.request.request_id]
        flight.record.transfer_end_s = self.env.now
        assert flight.prefill_state is not None and flight.decode_state is not None
        self.replicas[flight.prefill].release_held(flight.prefill_state)
        self.replicas[flight.decode].kv_received(flight.decode_state)

    # --------------------------------------------------------------------------------- jump bounds
    def _bound_for(self, index: int) -> Callable[[], float]:
        return lambda: self.arrival_bound(index)

    def arrival_bound(self, index: int) -> float:
        """The earliest time something from outside could change replica ``index``: a request, a
        handoff, a follow-up, a landed transfer or released blocks."""
        if index < self.prefill_shape.replicas and self._unsent[index]:
            return self.env.now
        bound = min(self._arrivals.next_arrival_s(), self.link.earliest_end_s())
        for other, replica in enumerate(self.replicas):
            if other != index and replica.busy_until < bound:
                bound = replica.busy_until
        return bound

    def _log(self) -> None:
        row = (self.env.now, sum(self._unsent), self.link.in_flight, self.link.bytes_in_flight())
        if self.rows[-1][0] == row[0]:
            self.rows[-1] = row
        else:
            self.rows.append(row)
