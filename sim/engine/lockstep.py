"""The data-parallel ranks of one expert-parallel server on a shared step clock.

vLLM runs a mixture of experts at ``--data-parallel-size N --enable-expert-parallel`` as N engines,
each with its own scheduler, KV cache and copy of the attention and dense weights, whose MoE layers
exchange tokens every step (:class:`sim.costs.terms.AllToAllCost`). The ranks therefore step
together: a rank with nothing scheduled runs a dummy batch so the others' collectives complete, and
every step lasts as long as the slowest rank's. The group models exactly that, one step at a time:

* at a step boundary every rank with work schedules its iteration as it would alone and reports
  its own time (the cost model's iteration without the routed experts) and its tokens;
* the step lasts ``max over ranks of own time + shared part(all ranks' tokens)``, the shared part
  being each rank's experts run on the tokens routed to them plus the all-to-all
  (:class:`sim.costs.terms.ExpertParallelCost`), the same expected value on every rank. Ranks
  synchronise at every MoE layer, and a rank whose own part is the longest is so in every layer (the
  same batch runs through each), so the sum of the per-layer maxima is the maximum of the sums;
* a rank with nothing to do runs a dummy batch of :data:`DUMMY_BATCH_TOKENS` token (vLLM's
  ``execute_dummy_batch``): it adds that token to the all-to-all and never sets the step's length (its
  own part is a one-token forward pass, shorter than any rank's real one);
* a rank that gets work while a step is in flight starts at the next boundary, as a vLLM engine that
  is running dummy batches picks its new request up at its next step.

Iterations are stepped one at a time (the ranks' event skipping would need them to jump together);
a group of one rank (expert parallelism over one server's TP group) pays its shared part alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import simpy


class LockstepRank(Protocol):
    """A rank as the group sees it: it is busy until the group's step ends."""

    busy_until: float


DUMMY_BATCH_TOKENS = 1
"""Tokens of the dummy forward pass an idle rank runs so that the others' collectives complete
(vLLM's ``DPEngineCoreProc`` calls ``execute_dummy_batch``, a one-token ``_dummy_run``)."""


class LockstepGroup:
    """``ranks`` engines sharing one step clock on ``env``; ``shared_s(tokens)`` is the part of a step
    every rank pays for all ranks' ``tokens`` (see the module docstring)."""

    def __init__(self, env: simpy.Environment, ranks: int, shared_s: Callable[[int], float]):
        if ranks < 1:
            raise ValueError(f"a lockstep group needs at least one rank, got {ranks}")
        self.env = env
        self.ranks = ranks
        self._shared_s = shared_s
        self._joined: list[tuple[LockstepRank, float, int]] = []  # ranks stepping at this instant
        self._step_done: simpy.Event = env.event()
        self._end_s = -1.0  # end of the step in flight (none before the first)
        self.steps = 0
        self.dummy_rank_steps = 0  # (rank, step) pairs in which a rank had nothing to do

    def in_flight(self) -> bool:
        """A step is running: a rank with new work waits for :meth:`boundary`."""
        return self.env.now < self._end_s

    def boundary(self) -> simpy.Event:
        """The end of the step in flight (or of the one being formed)."""
        return self._step_done

    def join(self, engine: LockstepRank, own_s: float, tokens: int) -> simpy.Event:
        """``engine`` runs an iteration of ``own_s`` seconds over ``tokens`` tokens in the step that
        starts now; the event fires when that step ends."""
        if not self._joined:
            self._step_done = self.env.event()
            # Launched once every rank stepping at this instant has joined: they all resume from the
            # same boundary (or arrival) events, processed before this zero delay.
            self.env.timeout(0).callbacks.append(self._launch)
        self._joined.append((engine, own_s, tokens))
        return self._step_done

    def _launch(self, _event: simpy.Event) -> None:
        joined, self._joined = self._joined, []
        idle = self.ranks - len(joined)
        tokens = sum(entry[2] for entry in joined)
        shared_s = self._shared_s(tokens + idle * DUMMY_BATCH_TOKENS) if tokens > 0 else 0.0
        step_s = max(entry[1] for entry in joined) + shared_s
        self._end_s = self.env.now + step_s
        for engine, _own_s, _tokens in joined:
            engine.busy_until = self._end_s
        self.steps += 1
        self.dummy_rank_steps += idle
        done = self._step_done

        def end(_timer: simpy.Event) -> None:
            done.succeed()

        self.env.timeout(step_s).callbacks.append(end)
