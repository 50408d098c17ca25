"""Synthetic workloads: arrivals, lengths, shared system prompts, few-shot templates, conversations.

Randomness: each quantity (prompt lengths, output lengths, gaps, prefix choices...) has its own numpy
Generator seeded from ``(seed, tag)``, drawn in vectorised chunks, so the stream is reproducible and
cheap. Everything about a conversation is drawn when it starts; in a closed loop each user has its
own Generator, so what a user sends never depends on the order in which the engine finishes requests.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from token_content import Segment, TokenContent, content_length
from workloads.arrivals import arrival_times, mean_rate_per_s
from workloads.base import Workload, WorkloadError
from workloads.config import (
    ChoiceDist,
    ClosedLoopArrival,
    ConstantDist,
    SyntheticWorkloadConfig,
    TableDist,
    UniformDist,
)
from workloads.content import OUTPUT_SLOT, PROMPT_SLOT, ContentIds
from workloads.distributions import Draws, Sampler, load_column, zipf_probabilities
from workloads.request import Request
from workloads.samples import with_sample_lengths

# Seed tags: one Generator per quantity, each seeded with (seed, tag).
_TAG_STRUCTURE, _TAG_ARRIVALS = 1, 2
_TAG_USER = 1000  # closed loop: user u uses (seed, _TAG_USER, u)
# closed loop: user u's client overheads, (seed, _TAG_OVERHEAD, u): a Generator of their own, so
# that configuring an overhead leaves every other quantity of the stream as it was
_TAG_OVERHEAD = 1001
_QUANTITIES = (
    "prompt_len",
    "output_len",
    "n",
    "beam_width",
    "prefix_use",
    "prefix_index",
    "template_use",
    "template_index",
    "turns",
    "user_turn_len",
    "turn_think_s",
    "user_think_s",
)


def _bernoulli(fraction: float) -> ChoiceDist | ConstantDist:
    if fraction >= 1.0:
        return ConstantDist(kind="constant", value=1)
    if fraction <= 0.0:
        return ConstantDist(kind="constant", value=0)
    return ChoiceDist(kind="choice", values=[0, 1], weights=[1 - fraction, fraction])


def _categorical(count: int, zipf_s: float) -> ChoiceDist:
    return ChoiceDist(
        kind="choice", values=list(range(count)), weights=zipf_probabilities(count, zipf_s).tolist()
    )


class _Draws:
    """One Draws per quantity; open loop: a Generator per quantity; a user: one Generator for all."""

    def __init__(self, samplers: dict[str, Sampler], rngs: dict[str, np.random.Generator], chunk: int):
        self.prompt_len, self.output_len, self.n, self.beam_width = (
            Draws(samplers[name], rngs[name], chunk) for name in _QUANTITIES[:4]
        )
        self.prefix_use, self.prefix_index, self.template_use, self.template_index = (
            Draws(samplers[name], rngs[name], chunk) for name in _QUANTITIES[4:8]
        )
        self.turns, self.user_turn_len, self.turn_think_s, self.user_think_s = (
            Draws(samplers[name], rngs[name], chunk) for name in _QUANTITIES[8:]
        )


@dataclass
class _Conversation:
    session_id: int
    last_request_id: int
    turns_left: int  # turns still to come after the last one issued
    # open loop only: values of the later turns, drawn when the conversation started
    user_turn_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    think_s: list[float] = field(default_factory=list)
    ns: list[int] = field(default_factory=list)
    beams: list[int] = field(default_factory=list)


@dataclass
class _User:
    draws: _Draws
    overhead: Draws  # send_delay_s, one draw per request the user sends
    last_request_id: int
    conversations: int = 0
    conversation: _Conversation | None = None


class SyntheticWorkload(Workload):
    def __init__(self, config: SyntheticWorkloadConfig, *, seed: int, base_dir: Path | None = None):
        self.config = config
        self.seed = int(seed)
        cfg = config
        self._pair_prompts: list[int] = []
        self._pair_outputs: list[int] = []
        prompt_spec: Any = cfg.prompt_len
        output_spec: Any = cfg.output_len
        if cfg.length_pairs is not None:
            pairs = cfg.length_pairs
            # lengths are at least one token, like every sampled length
            self._pair_prompts = np.maximum(
                load_column(pairs.path, pairs.prompt_len_column, base_dir, "length_pairs"), 1
            ).tolist()
            self._pair_outputs = np.maximum(
                load_column(pairs.path, pairs.output_len_column, base_dir, "length_pairs"), 1
            ).tolist()
            rows = len(self._pair_prompts)
            # with pairs, the "prompt_len" draws are row indices; later turns' outputs use the column
            prompt_spec = UniformDist(kind="uniform", low=0, high=rows - 1)
            output_spec = TableDist(kind="table", path=pairs.path, column=pairs.output_len_column)
        samplers: dict[str, Sampler] = {
            "prompt_len": Sampler(
                prompt_spec,
                what="prompt_len",
                integer=True,
                floor=1 if not self._pair_prompts else 0,
                base_dir=base_dir,
            ),
            "output_len": Sampler(output_spec, what="output_len", integer=True, floor=1, base_dir=base_dir),
            "n": Sampler(cfg.n, what="n", integer=True, floor=1, base_dir=base_dir),
            "beam_width": Sampler(
                cfg.beam_width, what="beam_width", integer=True, floor=1, base_dir=base_dir
            ),
        }
        prefix = cfg.shared_prefix
        samplers["prefix_use"] = Sampler(_bernoulli(prefix.fraction if prefix else 0), what="", integer=True)
        samplers["prefix_index"] = Sampler(
            _categorical(prefix.num_prefixes, prefix.zipf_s) if prefix else 0, what="", integer=True
        )
        few_shot = cfg.few_shot
        samplers["template_use"] = Sampler(
            _bernoulli(few_shot.fraction if few_shot else 0), what="", integer=True
        )
        samplers["template_index"] = Sampler(
            _categorical(few_shot.num_templates, few_shot.zipf_s) if few_shot else 0, what="", integer=True
        )
        turns = cfg.multi_turn
        samplers["turns"] = Sampler(turns.turns if turns else 1, what="turns", integer=True, floor=1)
        samplers["user_turn_len"] = Sampler(
            turns.user_turn_len if turns else 1,
            what="user_turn_len",
            integer=True,
            floor=1,
            base_dir=base_dir,
        )
        samplers["turn_think_s"] = Sampler(
            turns.think_time_s if turns else 0.0,
            what="multi_turn.think_time_s",
            integer=False,
            base_dir=base_dir,
        )
        closed = cfg.arrival if isinstance(cfg.arrival, ClosedLoopArrival) else None
        samplers["user_think_s"] = Sampler(
            closed.think_time_s if closed else 0.0,
            what="arrival.think_time_s",
            integer=False,
            base_dir=base_dir,
        )
        self._overhead_sampler = Sampler(
            closed.send_delay_s if closed else 0.0,
            what="arrival.send_delay_s",
            integer=False,
            base_dir=base_dir,
        )
        self._samplers = samplers
        self._closed = closed
        self._base_dir = base_dir
        self._prefix_samplers: tuple[Sampler | None, Sampler | None] = (
            Sampler(
                prefix.prefix_len, what="shared_prefix.prefix_len", integer=True, floor=1, base_dir=base_dir
            )
            if prefix
            else None,
            Sampler(few_shot.shot_len, what="few_shot.shot_len", integer=True, floor=1, base_dir=base_dir)
            if few_shot
            else None,
        )
        self._reset()

    def shared_prefixes(self) -> list[TokenContent]:
        return [(prefix,) for prefix in self.prefixes]

    # -- state -------------------------------------------------------------------------------------
    def _rng(self, *tags: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *tags])

    def _reset(self) -> None:
        cfg = self.config
        self.ids = ContentIds()
        structure = self._rng(_TAG_STRUCTURE)
        prefix_sampler, shot_sampler = self._prefix_samplers
        self.prefixes: list[Segment] = []
        if cfg.shared_prefix is not None and prefix_sampler is not None:
            lengths = prefix_sampler.sample(structure, cfg.shared_prefix.num_prefixes).tolist()
            self.prefixes = [(self.ids.new_shared(), int(length)) for length in lengths]
        self.templates: list[TokenContent] = []
        if cfg.few_shot is not None and shot_sampler is not None:
            fs = cfg.few_shot
            instruction: list[Segment] = (
                [(self.ids.new_shared(), fs.instruction_len)] if fs.instruction_len else []
            )
            pool_size = fs.example_pool_size or fs.num_templates * fs.num_shots
            pool = [
                (self.ids.new_shared(), int(length)) for length in shot_sampler.sample(structure, pool_size)
            ]
            for _ in range(fs.num_templates):
                picks = structure.permutation(pool_size)[: fs.num_shots]
                self.templates.append(tuple(instruction + [pool[i] for i in picks]))
        self._conversations: dict[int, _Conversation] = {}
        self._users: dict[int, _User] = {}
        self.counts = {
            "requests": 0,
            "conversations": 0,
            "follow_ups": 0,
            "conversations_cut_at_max_context": 0,
        }

    def _open_draws(self) -> _Draws:
        rngs = {name: self._rng(10 + i) for i, name in enumerate(_QUANTITIES)}
        return _Draws(self._samplers, rngs, chunk=1024)

    def _user_draws(self, user: int) -> _Draws:
        rng = self._rng(_TAG_USER, user)
        return _Draws(self._samplers, dict.fromkeys(_QUANTITIES, rng), chunk=16)

    def _user_overheads(self, user: int) -> Draws:
        return Draws(self._overhead_sampler, self._rng(_TAG_OVERHEAD, user), chunk=16)

    # -- building requests ---------------------------------------------------------------------------
    def _first_prompt(self, draws: _Draws, request_id: int, prompt_len: int) -> TokenContent:
        segments: list[Segment] = []
        if self.prefixes and draws.prefix_use.next():
            segments.append(self.prefixes[draws.prefix_index.next_int()])
        if self.templates and draws.template_use.next():
            segments.extend(self.templates[draws.template_index.next_int()])
        segments.append((ContentIds.for_request(request_id, PROMPT_SLOT), prompt_len))
        return tuple(segments)

    def _request(
        self,
        request_id: int,
        arrival_s: float,
        prompt: TokenContent,
        output_len: int,
        n: int,
        beam_width: int,
        session_id: int | None,
    ) -> Request:
        request = Request(
            request_id=request_id,
            arrival_s=arrival_s,
            prompt=prompt,
            output_len=output_len,
            output_content_id=ContentIds.for_request(request_id, OUTPUT_SLOT),
            n=n,
            beam_width=beam_width,
            session_id=session_id,
        )
        if self.config.sample_lengths == "identical":
            return request
        return with_sample_lengths(request, self._other_sample_lengths, self.seed)

    def _other_sample_lengths(self, rng: np.random.Generator, count: int) -> list[int]:
        """Independent samples draw their lengths from the workload's output distribution (with
        ``length_pairs``: from its output column, independently of the prompt)."""
        return self._samplers["output_len"].sample(rng, count).tolist()

    def _new_request(
        self, draws: _Draws, request_id: int, arrival_s: float, session_id: int | None
    ) -> Request:
        if self._pair_prompts:
            row = draws.prompt_len.next_int()
            prompt_len, output_len = self._pair_prompts[row], self._pair_outputs[row]
        else:
            prompt_len, output_len = draws.prompt_len.next_int(), draws.output_len.next_int()
        prompt = self._first_prompt(draws, request_id, prompt_len)
        return self._request(
            request_id,
            arrival_s,
            prompt,
            output_len,
            draws.n.next_int(),
            draws.beam_width.next_int(),
            session_id,
        )

    @staticmethod
    def _next_turn(finished: Request, request_id: int, user_turn_len: int) -> TokenContent:
        """The previous turn's prompt and output, then this turn's new user tokens."""
        return (
            *finished.prompt,
            (finished.output_content_id, finished.output_len),
            (ContentIds.for_request(request_id, PROMPT_SLOT), user_turn_len),
        )

    # -- the stream ----------------------------------------------------------------------------------
    def requests(self) -> Iterator[Request]:
        self._reset()
        if self._closed is not None:
            return self._closed_loop_first()
        return self._open_loop()

    def _open_loop(self) -> Iterator[Request]:
        cfg = self.config
        assert not isinstance(cfg.arrival, ClosedLoopArrival)
        draws = self._open_draws()
        times = arrival_times(cfg.arrival, self._rng(_TAG_ARRIVALS))
        budget = cfg.num_requests
        next_id = 0
        for conversation in itertools.count():
            if budget is not None and next_id >= budget:
                return
            arrival_s = next(times)
            if cfg.duration_s is not None and arrival_s > cfg.duration_s:
                return
            request_id = next_id
            if cfg.multi_turn is None:
                next_id += 1
                self.counts["requests"] += 1
                yield self._new_request(draws, request_id, arrival_s, None)
                continue
            turns = draws.turns.next_int()
            if budget is not None:
                turns = min(turns, budget - next_id)
            next_id += turns
            request = self._new_request(draws, request_id, arrival_s, conversation)
            if turns > 1:
                later = turns - 1
                self._conversations[conversation] = _Conversation(
                    session_id=conversation,
                    last_request_id=request_id,
                    turns_left=later,
                    user_turn_lens=[draws.user_turn_len.next_int() for _ in range(later)],
                    output_lens=[draws.output_len.next_int() for _ in range(later)],
                    think_s=[draws.turn_think_s.next() for _ in range(later)],
                    ns=[draws.n.next_int() for _ in range(later)],
                    beams=[draws.beam_width.next_int() for _ in range(later)],
                )
            self.counts["requests"] += 1
            self.counts["conversations"] += 1
            yield request

    def _closed_loop_first(self) -> Iterator[Request]:
        closed = self._closed
        assert closed is not None and self.config.num_requests is not None
        users = min(closed.num_users, self.config.num_requests)
        first: list[Request] = []
        for user in range(users):
            overhead = self._user_overheads(user)
            # vLLM's client launches its first requests together; each reaches the engine after
            # its own overhead (so a later user may arrive first)
            arrival_s = closed.ramp_up_s * user / closed.num_users + overhead.next()
            if self.config.duration_s is not None and arrival_s > self.config.duration_s:
                continue
            state = _User(draws=self._user_draws(user), overhead=overhead, last_request_id=user)
            self._users[user] = state
            self.counts["requests"] += 1
            first.append(self._start_user_request(state, user, user, arrival_s))
        # the stream is in arrival order (ties: user order); sorted() is stable
        yield from sorted(first, key=lambda request: request.arrival_s)

    def _start_user_request(self, state: _User, user: int, request_id: int, arrival_s: float) -> Request:
        """A user's request that starts something new: an independent request or a conversation."""
        assert self._closed is not None
        state.last_request_id = request_id
        if self.config.multi_turn is None:
            return self._new_request(state.draws, request_id, arrival_s, user)
        session = state.conversations * self._closed.num_users + user
        state.conversations += 1
        self.counts["conversations"] += 1
        turns = state.draws.turns.next_int()
        state.conversation = _Conversation(
            session_id=session, last_request_id=request_id, turns_left=turns - 1
        )
        return self._new_request(state.draws, request_id, arrival_s, session)

    # -- closed loop -----------------------------------------------------------------------------------
    @property
    def arrivals_known_up_front(self) -> bool:
        return self._closed is None and self.config.multi_turn is None

    def follow_up(self, finished: Request, finish_s: float) -> Request | None:
        if self._closed is not None:
            return self._user_follow_up(finished, finish_s)
        if finished.session_id is None:
            return None
        conversation = self._conversations.get(finished.session_id)
        if conversation is None:
            return None
        if finished.request_id != conversation.last_request_id:
            raise WorkloadError(
                f"follow_up: request {finished.request_id} is not the latest turn "
                f"({conversation.last_request_id}) of conversation {finished.session_id}"
            )
        user_turn_len = conversation.user_turn_lens.pop(0)
        output_len = conversation.output_lens.pop(0)
        think_s = conversation.think_s.pop(0)
        n, beam_width = conversation.ns.pop(0), conversation.beams.pop(0)
        conversation.turns_left -= 1
        if conversation.turns_left == 0:
            del self._conversations[finished.session_id]
        request_id = finished.request_id + 1
        conversation.last_request_id = request_id
        prompt = self._next_turn(finished, request_id, user_turn_len)
        limit = self.config.multi_turn.max_context_len if self.config.multi_turn else None
        if limit is not None and content_length(prompt) + output_len > limit:
            self._conversations.pop(finished.session_id, None)
            self.counts["conversations_cut_at_max_context"] += 1
            return None
        arrival_s = finish_s + think_s
        if self.config.duration_s is not None and arrival_s > self.config.duration_s:
            self._conversations.pop(finished.session_id, None)
            return None
        self.counts["follow_ups"] += 1
        return self._request(request_id, arrival_s, prompt, output_len, n, beam_width, finished.session_id)

    def _user_follow_up(self, finished: Request, finish_s: float) -> Request | None:
        closed = self._closed
        assert closed is not None and self.config.num_requests is not None
        user = finished.request_id % closed.num_users
        state = self._users.get(user)
        if state is None or state.last_request_id != finished.request_id:
            raise WorkloadError(
                f"follow_up: request {finished.request_id} is not user {user}'s latest request"
            )
        request_id = finished.request_id + closed.num_users
        if request_id >= self.config.num_requests:
            return None
        draws = state.draws
        overhead_s = state.overhead.next()  # one draw per request the user sends
        conversation = state.conversation
        request: Request | None = None
        if conversation is not None and conversation.turns_left > 0:
            conversation.turns_left -= 1
            user_turn_len = draws.user_turn_len.next_int()
            output_len = draws.output_len.next_int()
            think_s = draws.turn_think_s.next()
            n, beam_width = draws.n.next_int(), draws.beam_width.next_int()
            prompt = self._next_turn(finished, request_id, user_turn_len)
            limit = self.config.multi_turn.max_context_len if self.config.multi_turn else None
            if limit is not None and content_length(prompt) + output_len > limit:
                self.counts["conversations_cut_at_max_context"] += 1
            else:
                arrival_s = finish_s + think_s + overhead_s
                request = self._request(
                    request_id, arrival_s, prompt, output_len, n, beam_width, conversation.session_id
                )
                state.last_request_id = request_id
        if request is None:
            arrival_s = finish_s + draws.user_think_s.next() + overhead_s
            if self.config.duration_s is not None and arrival_s > self.config.duration_s:
                return None
            request = self._start_user_request(state, user, request_id, arrival_s)
        elif self.config.duration_s is not None and request.arrival_s > self.config.duration_s:
            return None
        self.counts["requests"] += 1
        self.counts["follow_ups"] += 1
        return request

    # -- summary -------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        cfg = self.config
        arrival = cfg.arrival
        info: dict[str, Any] = {
            "kind": "synthetic",
            "seed": self.seed,
            "num_requests": cfg.num_requests,
            "arrival": arrival.kind,
            "config": cfg.model_dump(mode="json", exclude_none=True),
            "counts": dict(self.counts),
        }
        if not isinstance(arrival, ClosedLoopArrival):
            info["rate_per_s"] = mean_rate_per_s(arrival)
            if cfg.multi_turn is not None:
                info["rate_counts"] = "conversation starts (later turns follow finishes)"
        if self.prefixes:
            info["prefix_lens"] = [length for _, length in self.prefixes[:64]]
        if self.templates:
            info["template_lens"] = [content_length(template) for template in self.templates[:64]]
        return info
