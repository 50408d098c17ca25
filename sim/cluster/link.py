"""The link a disaggregated cluster sends KV over: pipes whose bandwidth concurrent transfers share.

A transfer waits the link's fixed latency (setup, the receiver's notification), then its bytes flow
through one *pipe*. Which transfers share a pipe is the link's ``shared_by``: each (prefill, decode)
pair its own, each prefill replica's NICs, each decode replica's, or one fabric for the cluster. The
transfers in a pipe share its bandwidth fairly (processor sharing: n transfers each get 1/n), the
first-order model of flows through one bottleneck, as BLIS's KV-transfer contention model and
DistServe's bandwidth accounting take it. A transfer's end is therefore known exactly only while no
other one joins its pipe; a new one only delays it, so :meth:`TransferLink.earliest_end_s` (what the
replicas bound their event-skipping jumps by) is a lower bound on the next end.

Bandwidth is per GPU and one direction; a replica of tensor parallelism t sends its KV over t GPUs'
links in parallel (each rank its own share of the heads), so a transfer between pools of TP t_p and
t_d flows at ``min(t_p, t_d)`` times the pipe's per-GPU bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import simpy

from sim.config import LinkConfig
from sim.hardware.gpus import GpuSpec

GB = 10**9
RDMA_NIC_BYTES_PER_S = 50 * GB  # 400 Gb/s (InfiniBand NDR / ConnectX-7), one NIC per GPU as in a DGX H100
DEFAULT_LATENCY_S = {"nvlink": 10e-6, "pcie": 10e-6, "rdma": 20e-6}  # assumed, not measured
DONE_BYTES = 1.0  # a transfer within a byte of its end is done (the rest is rounding)


@dataclass(frozen=True)
class LinkSpec:
    """A resolved link: per-GPU bandwidth (one direction; ``math.inf``: instantaneous) and latency."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    shared_by: str

    @property
    def label(self) -> str:
        rate = (
            "infinite"
            if math.isinf(self.bandwidth_bytes_per_s)
            else f"{self.bandwidth_bytes_per_s / GB:g} GB/s"
        )
        return f"{self.name}: {rate} per GPU one way, {self.latency_s * 1e6:g} us latency, shared by {self.shared_by}"


def resolve_link(config: LinkConfig, prefill_gpu: GpuSpec, where: str = "link") -> LinkSpec:
    """The link a config names, its bandwidth from the prefill GPU where the kind is a GPU's own link.
    Raises ValueError naming the key when the GPU has no such link."""
    if config.bandwidth_gb_per_s is not None:
        bandwidth = config.bandwidth_gb_per_s * GB
    elif config.kind == "nvlink":
        if not prefill_gpu.nvlink_bandwidth_bytes_per_s:
            raise ValueError(
                f"{where}.kind: nvlink, but the prefill pool's GPU {prefill_gpu.name} has no NVLink; use pcie, "
                "rdma, or give bandwidth_gb_per_s"
            )
        bandwidth = prefill_gpu.tensor_parallel_link_bytes_per_s
    elif config.kind == "pcie":
        bandwidth = prefill_gpu.host_link_bytes_per_s
    else:
        bandwidth = RDMA_NIC_BYTES_PER_S
    latency = config.latency_s if config.latency_s is not None else DEFAULT_LATENCY_S.get(config.kind, 0.0)
    return LinkSpec(config.kind, bandwidth, latency, config.shared_by)


class Transfer:
    """One request's KV on its way."""

    __slots__ = ("nbytes", "remaining", "lanes", "on_done", "flowing_s")

    def __init__(self, nbytes: float, lanes: int, on_done: Callable[[], None]):
        self.nbytes = nbytes
        self.remaining = float(nbytes)
        self.lanes = lanes
        self.on_done = on_done
        self.flowing_s = math.inf  # when its latency is over and its bytes start to flow


class Pipe:
    """Transfers sharing one bandwidth fairly. Each transfer's rate is its share times its lanes."""

    def __init__(self, env: simpy.Environment, bandwidth_bytes_per_s: float, on_change: Callable[[], None]):
        self.env = env
        self.bandwidth = bandwidth_bytes_per_s
        self.active: list[Transfer] = []
        self.updated_s = 0.0
        self.busy_s = 0.0  # time with at least one transfer flowing
        self.next_end_s = math.inf
        self._version = 0  # a scheduled end whose version is stale was overtaken by a change
        self._on_change = on_change

    def rate(self, transfer: Transfer) -> float:
        return self.bandwidth * transfer.lanes / len(self.active)

    def add(self, transfer: Transfer) -> None:
        self.progress()
        self.active.append(transfer)
        self._schedule()

    def progress(self) -> None:
        now = self.env.now
        elapsed = now - self.updated_s
        if self.active and elapsed > 0:
            for transfer in self.active:
                transfer.remaining -= self.rate(transfer) * elapsed
            self.busy_s += elapsed
        self.updated_s = now

    def _schedule(self) -> None:
        self._version += 1
        if not self.active:
            self.next_end_s = math.inf
            return
        delay = min(max(0.0, transfer.remaining) / self.rate(transfer) for transfer in self.active)
        self.next_end_s = self.env.now + delay
        version = self._version
        self.env.timeout(delay).callbacks.append(lambda _event: self._end(version))

    def _end(self, version: int) -> None:
        if version != self._version:
            return
        self.progress()
        done = [transfer for transfer in self.active if transfer.remaining <= DONE_BYTES]
        if not done:  # rounding left the nearest one a hair short: it is the one due now
            done = [min(self.active, key=lambda transfer: transfer.remaining / self.rate(transfer))]
        for transfer in done:
            self.active.remove(transfer)
        self._schedule()
        self._on_change()
        for transfer in done:
            transfer.on_done()


class TransferLink:
    def __init__(self, env: simpy.Environment, spec: LinkSpec, on_change: Callable[[], None] | None = None):
        """``on_change()`` after every transfer's start and end (the cluster logs its series there)."""
        self.env = env
        self.spec = spec
        self.pipes: dict[Hashable, Pipe] = {}
        self._starting: list[Transfer] = []  # in their latency, not flowing yet
        self.transfers = 0
        self.bytes_sent = 0.0
        self.in_flight = 0
        self._on_change = on_change if on_change is not None else _nothing

    def pipe_key(self, prefill: int, decode: int) -> Hashable:
        shared_by = self.spec.shared_by
        if shared_by == "pair":
            return (prefill, decode)
        if shared_by == "prefill":
            return prefill
        if shared_by == "decode":
            return decode
        return "fabric"

    def send(self, nbytes: float, prefill: int, decode: int, lanes: int, on_done: Callable[[], None]) -> None:
        """Start sending ``nbytes`` from replica ``prefill`` to ``decode`` over ``lanes`` GPU links;
        ``on_done()`` when the last byte is there."""
        self.transfers += 1
        self.in_flight += 1

        def finished() -> None:
            self.in_flight -= 1
            self.bytes_sent += nbytes
            self._on_change()
            on_done()

        transfer = Transfer(nbytes, lanes, finished)
        latency = self.spec.latency_s
        if math.isinf(self.spec.bandwidth_bytes_per_s) or nbytes <= 0:
            self._after_latency(transfer, finished)  # no bandwidth to share: only the latency
            return
        key = self.pipe_key(prefill, decode)
        pipe = self.pipes.get(key)
        if pipe is None:
            pipe = self.pipes[key] = Pipe(self.env, self.spec.bandwidth_bytes_per_s, _nothing)
        if latency > 0:
            self._after_latency(transfer, lambda: pipe.add(transfer))
        else:
            transfer.flowing_s = self.env.now
            pipe.add(transfer)
            self._on_change()

    def _after_latency(self, transfer: Transfer, then: Callable[[], None]) -> None:
        transfer.flowing_s = self.env.now + self.spec.latency_s
        if self.spec.latency_s <= 0:
            then()
            return
        self._starting.append(transfer)

        def over(_event) -> None:
            self._starting.remove(transfer)
            then()

        self.env.timeout(self.spec.latency_s).callbacks.append(over)
        self._on_change()

    def earliest_end_s(self) -> float:
        """A lower bound on when the next transfer in flight ends (later joiners only delay them)."""
        ends = [pipe.next_end_s for pipe in self.pipes.values()]
        bandwidth = self.spec.bandwidth_bytes_per_s
        ends += [t.flowing_s + t.nbytes / (bandwidth * t.lanes) for t in self._starting]
        return min(ends, default=math.inf)

    def bytes_in_flight(self) -> float:
        """Bytes of the transfers in flight not delivered yet (as of their pipes' last change)."""
        remaining = sum(max(0.0, t.remaining) for pipe in self.pipes.values() for t in pipe.active)
        return remaining + sum(t.nbytes for t in self._starting)

    def busy_s(self) -> float:
        """Pipe-seconds with a transfer flowing, summed over the pipes (progress as of now)."""
        for pipe in self.pipes.values():
            pipe.progress()
        return sum(pipe.busy_s for pipe in self.pipes.values())


def _nothing() -> None:
    return None
