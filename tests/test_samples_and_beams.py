"""Parallel samples that stop independently, and the per-beam re-parenting model of beam search."""

from __future__ import annotations

import math

import numpy as np
import pytest

from policies import PoolSpec, make_policy
from policies.base import OutOfKVMemory
from sim.engine.core import Engine, EngineKnobs
from sim.outputs.metrics import requests_frame
from tests.engine_helpers import ConstantCost, RoundCostModel, request


def run(policy_name, pool, requests, step_mode="skip", costs=None, seed=0, **knobs):
    engine = Engine(
        make_policy(policy_name, pool),
        costs or RoundCostModel(),
        EngineKnobs(max_model_len=pool.max_model_len, step_mode=step_mode, **knobs),
        iter(requests),
        seed=seed,
        block_size=pool.block_size,
    )
    engine.run()
    return engine


def physical_logical_blocks(engine, block_size):
    """(time, live physical blocks, logical blocks, sequences running) from each instant on (the
    last row of an instant: rows in between last no time)."""
    frame = engine.recorder.frame()
    series: list[tuple] = []
    for time_s, physical, logical, seqs in frame[
        ["time_s", "physical_tokens", "logical_tokens", "num_sequences_running"]
    ].itertuples(index=False):
        point = (round(time_s, 9), physical // block_size, logical // block_size, seqs)
        if series and series[-1][0] == point[0]:
            series.pop()
        if not series or series[-1][1:] != point[1:]:
            series.append(point)
    return series


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_three_samples_of_lengths_2_5_9_free_their_own_blocks_by_hand(step_mode):
    """1 request, n = 3, sample lengths 2 / 5 / 9, prompt 6 tokens, block 4, prefix policy (shares
    blocks, copies a shared partial tail on write). Decode step 1 s; prefill 1 s + 0.01 s/token.

    t = 0: the 6-token prompt takes 2 blocks (B0 full, B1 with 2 tokens); its prefill ends at 1.06 s.
    t = 1.06: first token: fork into 3 samples of 7 tokens; B1 is shared by 3, so the first two to
      write copy it (2 COW copies): B0 shared + 3 own tails = 4 physical, 3 x 2 = 6 logical blocks.
    Decode iteration k ends at 1.06 + k with 1 + k tokens generated.
    t = 2.06: sample A (2 tokens, 8 in all) finishes and frees its own tail; the iteration starting
      then writes token 9 of B and C, each takes a third block: B0 + 2 x 2 = 5 physical, 6 logical.
    t = 5.06: B (5 tokens, 11 in all) finishes and frees its 2 own blocks: C holds B0 + 2 own
      = 3 blocks, 3 logical.
    t = 6.06: C writes token 13 (generated 6 -> 7): a fourth block, 4 physical, 4 logical.
    t = 9.06: C generated 9: the request finishes, everything is freed.
    """
    pool = PoolSpec(4 * 32, 4, 64)
    sample = request(0, 0.0, 6, 2, n=3, sample_output_lens=(2, 5, 9))
    engine = run("prefix", pool, [sample], step_mode)
    expected = [
        (0.0, 2, 2, 1),
        (1.06, 4, 6, 3),
        (2.06, 5, 6, 2),
        (5.06, 3, 3, 1),
        (6.06, 4, 4, 1),
        (9.06, 0, 0, 0),
    ]
    if step_mode == "skip":
        # The block taken at 6.06 is taken inside a decode jump: observed for the averages, no row.
        expected.remove((6.06, 4, 4, 1))
    assert physical_logical_blocks(engine, 4) == expected
    assert engine.policy.stats.cow_copies == 2
    record = engine.records[0]
    assert (record.outcome, record.first_token_s, record.finish_s) == ("finished", 1.06, pytest.approx(9.06))
    assert (record.output_tokens, record.sample_output_tokens) == (9, 2 + 5 + 9)
    # Tokens decoded: 3 first tokens, then 3 / 2 / 2 / 2 / 1 / 1 / 1 / 1 sequences per iteration.
    assert engine.counters.output_tokens == 16
    # TPOT: 8 decode steps of the longest sample in 9.06 - 1.06 = 8 s.
    assert requests_frame(engine.records)["tpot_s"].iloc[0] == pytest.approx(1.0)
    # Time-averaged sharing: physical 2 x 1.06 + 4 + 5 x 3 + 3 + 4 x 3 = 36.12 block-seconds,
    # logical 2 x 1.06 + 6 + 6 x 3 + 3 + 4 x 3 = 41.12.
    saved = engine.recorder.time_averages(engine.env.now)["memory_saved_by_sharing_frac"]
    assert saved == pytest.approx(1 - 36.12 / 41.12, rel=1e-9)


def test_identical_sample_lengths_keep_every_sample_to_the_end():
    pool = PoolSpec(4 * 32, 4, 64)
    engine = run("prefix", pool, [request(0, 0.0, 6, 9, n=3)])
    series = physical_logical_blocks(engine, 4)
    assert [point[3] for point in series] == [1, 3, 0]  # all three samples run to 9 tokens
    assert engine.records[0].sample_output_tokens == 27


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_preempted_request_restarts_only_its_unfinished_samples(step_mode):
    """Request 1 (n = 2, lengths 1 and 20) loses its short sample at its first token (2.16 s); when
    request 0 needs a block the pool lacks, the newest request (1) is preempted, and it comes back
    with its one unfinished sample only: from then on every running request runs one sequence."""
    pool = PoolSpec(4 * 12, 4, 64)
    requests = [request(0, 0.0, 8, 30), request(1, 0.5, 8, 1, n=2, sample_output_lens=(1, 20))]
    engine = run("paged", pool, requests, step_mode)
    assert [r.outcome for r in engine.records] == ["finished", "finished"]
    assert engine.records[1].preemptions > 0 and engine.records[1].first_token_s == pytest.approx(2.16)
    assert engine.records[1].sample_output_tokens == 21
    frame = engine.recorder.frame()
    after = frame[frame["preemptions"] > 0]
    assert (after["num_sequences_running"] == after["num_requests_running"]).all()
    assert engine.policy.breakdown().free == pool.kv_pool_tokens


def beam_saving(q, width, seed=0, requests=20):
    pool = PoolSpec(16 * 4096, 16, 2048)
    stream = [request(i, 0.0, 20, 300, beam_width=width) for i in range(requests)]
    engine = run("prefix", pool, stream, beam_reparent_prob=q, seed=seed)
    return engine, engine.recorder.time_averages(engine.env.now)["memory_saved_by_sharing_frac"]


def test_beam_replacement_count_follows_the_binomial_model():
    """Each beam is replaced with probability q per step: over many steps the mean number replaced
    per step is width x q (capped at width - 1 per step, negligible at q = 0.1: P(all 4) = 1e-4)."""
    from sim.engine.beams import BeamDraws

    draws = BeamDraws(np.random.default_rng(5), 0.1)
    steps = 20_000  # standard errors: 0.25 % of the mean count, 0.6 % of the mean interval
    width = 4
    rate = 1 - (1 - 0.1) ** width  # steps with at least one replacement
    total = 0
    for _ in range(steps):
        total += len(draws.replaced(width))
    # Given a replacement step, the expected count is width q / (1 - (1 - q)^width) = 0.4 / 0.3439.
    expected = width * 0.1 / rate
    assert total / steps == pytest.approx(expected, rel=0.01)
    intervals = [draws.interval(width) for _ in range(steps)]
    assert np.mean(intervals) == pytest.approx(1 / rate, rel=0.02)


def test_beam_replacements_at_q_0_and_at_a_high_q():
    """q = 0: no step ever replaces a beam. q = 0.9, width 3: given a replacing step, k beams are
    replaced with odds 3 x 0.9 x 0.01 : 3 x 0.81 x 0.1 : 0.729 (k = 1, 2, 3); three would leave no
    survivor, so the cap is 2: P(2) = (0.243 + 0.729) / 0.999 = 0.973, P(1) = 0.027."""
    from sim.engine.beams import BeamDraws
    from sim.engine.decoding import NEVER

    assert BeamDraws(np.random.default_rng(5), 0.0).interval(4) >= NEVER
    draws = BeamDraws(np.random.default_rng(5), 0.9)
    counts = [len(draws.replaced(3)) for _ in range(2_000)]
    assert set(counts) == {1, 2}
    assert counts.count(2) / 2_000 == pytest.approx(0.973, abs=0.015)  # 4 standard errors


def test_beam_sharing_rises_with_q_and_keeps_the_breakdown_exact():
    _, low = beam_saving(0.005, 4)
    engine, high = beam_saving(0.2, 4)
    assert high > low
    final = engine.policy.breakdown()
    assert final.used == final.reserved == final.internal_fragmentation == 0
    assert engine.counters.output_tokens == 20 * 4 * 300


def test_beam_replacements_charge_their_copy_on_write():
    """A replaced beam forks a survivor mid-block: its next write copies the shared tail, and every
    copy is charged in the iteration that makes it (none is lost at a fork's first token)."""

    class CopyCharged(RoundCostModel):
        def copy_blocks_s(self, num_blocks):
            return 0.001 * num_blocks

    pool = PoolSpec(16 * 256, 16, 512)
    stream = [request(0, 0.0, 20, 100, beam_width=4)]
    plain = run("prefix", pool, stream, beam_reparent_prob=0.1, seed=3)
    charged = run("prefix", pool, stream, costs=CopyCharged(), beam_reparent_prob=0.1, seed=3)
    copies = charged.policy.stats.cow_copies
    assert copies == plain.policy.stats.cow_copies > 3
    assert charged.env.now - plain.env.now == pytest.approx(0.001 * copies, rel=1e-9)
    assert math.isclose(charged.records[0].first_token_s, plain.records[0].first_token_s)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_beam_group_that_fits_in_tokens_but_not_in_blocks_is_rejected_not_stalled(step_mode):
    """Pool 10 blocks of 16 (160 slots); 3 beams of prompt 10 + output 40 = 150 tokens pass the
    arrival check (150 <= 160), but plain paging copies the prompt into each beam and each needs
    ceil(50 / 16) = 4 blocks: 12 > 10. Alone in the pool the beams hold 3 x 3 = 9 blocks at token
    33; at token 49 the first beam takes the 10th block and the second finds none: rejected with
    its reason, and the next request runs (before: EngineStalled)."""
    pool = PoolSpec(160, 16, 160)
    stream = [request(0, 0.0, 10, 40, beam_width=3), request(1, 1.0, 10, 5)]
    engine = run("paged", pool, stream, step_mode)
    first, second = sorted(engine.records, key=lambda r: r.request_id)
    assert (first.outcome, first.reason) == (
        "rejected",
        "its 3 samples/beams do not fit in the KV pool even alone",
    )
    assert first.preemptions == 0 and engine.counters.preemptions == 0
    assert second.outcome == "finished"
    assert engine.policy.breakdown().free == pool.kv_pool_tokens


def test_a_sample_longer_than_max_model_len_rejects_the_request_naming_it():
    pool = PoolSpec(4 * 32, 4, 64)
    engine = run("prefix", pool, [request(0, 0.0, 10, 5, n=2, sample_output_lens=(5, 60))])
    record = engine.records[0]
    assert record.outcome == "rejected"
    assert record.reason == "prompt 10 + longest sample 60 = 70 tokens exceeds max_model_len=64"


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_beam_replacements_keep_the_batch_at_the_beam_width(step_mode):
    """Replaced beams are freed and re-forked from survivors: the batch holds 4 sequences from the
    first token to the finish, however many beams a step replaces (q = 0.3: 0 to 4 of them)."""
    pool = PoolSpec(16 * 256, 16, 512)
    engine = run(
        "prefix", pool, [request(0, 0.0, 20, 100, beam_width=4)], step_mode, beam_reparent_prob=0.3, seed=3
    )
    record = engine.records[0]
    series = engine.sink.timeseries()
    decoding = series[(series["time_s"] >= record.first_token_s) & (series["time_s"] < record.finish_s)]
    assert len(decoding) > 10
    assert set(decoding["num_sequences_running"]) == {4}


def test_a_request_leaving_before_its_fork_gives_back_its_samples_places():
    # max_num_seqs counts an admitted request's samples from admission (vLLM budgets n sequences),
    # the unforked ones apart until the fork: a request that leaves in its prompt (preempted) must
    # give those places back too, or max_num_seqs shrinks for good.
    from sim.engine.batch import Batch
    from sim.engine.decoding import RequestState
    from sim.outputs.metrics import RequestRecord

    batch = Batch(max_num_seqs=3, swap_space_tokens=0)
    state = RequestState(request(1, 0.0, 8, 4, n=2), RequestRecord(1, 0.0, 8, 4, 2, 1, 8))
    batch.join(state)
    state.seq_ids = [7]  # (what admission gives it: one sequence until the fork)
    assert (batch.running_seqs, batch.unforked_seqs) == (1, 1)
    assert batch.has_room(1) and not batch.has_room(2)
    batch.leave(state)
    assert (batch.running_seqs, batch.unforked_seqs) == (0, 0)
    assert batch.has_room(3)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_forked_request_that_finishes_gives_back_exactly_its_places(step_mode):
    """max_num_seqs 2. R0 (prompt 4, two samples of 2 tokens) takes both places from its admission
    at 0; R1, R2, R3 (prompt 4, 1 token) wait. it 1 [0, 1.04): R0's prompt, forked at its first token
    (its unforked place becomes its second sequence); it 2 [1.04, 2.04): both samples end. At 2.04
    the two places take R1 and R2 (prompts 8: 1.08 s, both finish at 3.12), and R3 the place one of
    them leaves: [3.12, 4.16). (A fork that gave back one place too many would let R3 in at 2.04.)"""
    requests = [
        request(0, 0.0, 4, 2, n=2, sample_output_lens=(2, 2)),
        *(request(index, 0.0, 4, 1) for index in (1, 2, 3)),
    ]
    engine = run("paged", PoolSpec(160, 16, 64), requests, step_mode, max_num_seqs=2)
    admitted = {record.request_id: record.admitted_s for record in engine.records}
    finished = {record.request_id: record.finish_s for record in engine.records}
    assert admitted == pytest.approx({0: 0.0, 1: 2.04, 2: 2.04, 3: 3.12})
    assert finished == pytest.approx({0: 2.04, 1: 3.12, 2: 3.12, 3: 4.16})


def test_each_sample_decodes_its_own_tokens_and_caches_them_apart():
    """Prompt 8 (2 blocks of 4), four samples of 8 tokens (2 blocks each), prefix caching. The
    samples share the prompt's blocks (no copy: the prompt ends on a block boundary) and each fills
    blocks of its own, which stay cached when the request ends: the prompt's 2 blocks and 2 of each
    sample's, 10 blocks, 40 tokens; the other 6 blocks free."""
    requests = [request(0, 0.0, 8, 8, n=4, sample_output_lens=(8, 8, 8, 8))]
    engine = run("prefix", PoolSpec(64, 4, 32), requests)
    assert engine.records[0].outcome == "finished"
    final = engine.policy.breakdown()
    assert (final.used, final.reserved, final.cached, final.free) == (0, 0, 40, 24)


class ScriptedBeams:
    """Beam draws chosen by the test: every decode step is a beam step; the first replaces beams 2
    and 3 of four, forked from survivors 0 and 1; later ones replace nothing."""

    def __init__(self):
        self.steps = 0

    @staticmethod
    def interval(width):
        return 1

    def replaced(self, width):
        self.steps += 1
        return {2, 3} if self.steps == 1 else set()

    @staticmethod
    def parents(survivors, replacements):
        return [0, 1][:replacements]


class ForkRefusedForOneParent:
    """The engine's KV coordinator, except that forking from ``refused_parent`` runs out of memory
    (once); every sequence freed is noted with its ``finished`` flag."""

    def __init__(self, kv):
        self._kv = kv
        self.refused_parent: int | None = None
        self.freed: list[tuple[int, bool]] = []

    def fork(self, parent, children):
        if parent == self.refused_parent:
            self.refused_parent = None
            raise OutOfKVMemory("(test) no room for this parent's children", len(children), 0)
        return self._kv.fork(parent, children)

    def free(self, seq_id, finished=True):
        self.freed.append((seq_id, finished))
        return self._kv.free(seq_id, finished=finished)

    def __getattr__(self, name):
        return getattr(self._kv, name)


@pytest.mark.python_sources
def test_a_beam_step_whose_second_parent_cannot_fork_frees_the_first_parents_children():
    """Request 0's prompt is sequence 1 (request 1's is 2); its first token forks beams 3, 4, 5. At
    the first beam step beams 4 and 5 (indices 2 and 3) are freed as finished, to be replaced by a
    child of beam 1 (sequence 6) and one of beam 3 (7). Beam 3's fork runs out of memory once: child
    6, already forked, is freed unfinished (it holds no decoded output), and the newest request,
    request 1, is preempted, as vLLM preempts for a token; the retried fork fits. Request 0 finishes without a preemption, request 1 after one; the pool ends
    empty. (kvsim used to preempt the forking request itself: two requests whose forks fit one at a
    time then preempted each other for ever.)"""
    pool = PoolSpec(16 * 64, 16, 512)
    engine = Engine(
        make_policy("paged", pool),
        RoundCostModel(),
        EngineKnobs(max_model_len=512, beam_reparent_prob=0.5),
        iter([request(0, 0.0, 20, 6, beam_width=4), request(1, 0.0, 10, 40)]),
        block_size=pool.block_size,
    )
    completions = engine.completions
    completions.beams = ScriptedBeams()
    spy = ForkRefusedForOneParent(completions.kv)
    completions.kv = spy
    beam_step = completions.beam_step

    def first_step_refuses_the_second_survivor(state):
        if completions.beams.steps == 0:
            spy.refused_parent = state.seq_ids[1]
        return beam_step(state)

    completions.beam_step = first_step_refuses_the_second_survivor
    engine.run()
    # Then request 0's beams 1, 3 and the retried children 6, 7 as it finishes, and request 1's rerun
    # (sequence 8). (Request 1's preemption frees its sequence 2 through the growth path, which the
    # spy on the completions does not see.)
    assert spy.freed == [
        (5, True),
        (4, True),
        (6, False),
        (1, True),
        (3, True),
        (6, True),
        (7, True),
        (8, True),
    ]
    preemptions = {record.request_id: (record.outcome, record.preemptions) for record in engine.records}
    assert preemptions == {0: ("finished", 0), 1: ("finished", 1)}
    assert engine.counters.preemptions == 1
    assert engine.policy.breakdown().free == pool.kv_pool_tokens


class CountedBeamSteps:
    """Beam draws that replace nothing, every ``every`` decode steps; the steps are counted."""

    def __init__(self, every):
        self.every = every
        self.widths: list[int] = []

    def interval(self, width):
        return self.every

    def replaced(self, width):
        self.widths.append(width)
        return set()

    @staticmethod
    def parents(survivors, replacements):
        return []


@pytest.mark.python_sources
@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_two_beams_step_every_interval_from_their_first_token(step_mode):
    """Beam width 2, output 11, a beam step every 3 decode steps: the first token comes with the
    prompt (clock 0), the next 10 at clocks 1..10; the steps fall at clocks 3, 6 and 9 (the one that
    would fall at 12 comes after the last token), each over both beams."""
    pool = PoolSpec(16 * 64, 16, 512)
    engine = Engine(
        make_policy("paged", pool),
        RoundCostModel(),
        EngineKnobs(max_model_len=512, beam_reparent_prob=0.5, step_mode=step_mode),
        iter([request(0, 0.0, 20, 11, beam_width=2)]),
        block_size=pool.block_size,
    )
    steps = CountedBeamSteps(3)
    engine.completions.beams = steps
    engine.run()
    assert steps.widths == [2, 2, 2]
    assert engine.records[0].outcome == "finished"


class ForksNoted:
    """The engine's KV coordinator, noting each fork's children."""

    def __init__(self, kv):
        self._kv = kv
        self.children: list[tuple[int, int]] = []

    def fork(self, parent, children):
        self.children.extend((child.seq_id, child.output_content_id) for child in children)
        return self._kv.fork(parent, children)

    def __getattr__(self, name):
        return getattr(self._kv, name)


@pytest.mark.python_sources
def test_every_forked_sample_generates_an_output_stream_of_its_own():
    """Two requests of three samples each: the four children each generate a stream of their own,
    negative (no child's output can match a workload's content: the workloads' ids are not negative)
    and never the same twice (two samples' outputs never look like one shared prefix to a cache)."""
    pool = PoolSpec(16 * 64, 16, 512)
    engine = Engine(
        make_policy("prefix", pool),
        RoundCostModel(),
        EngineKnobs(max_model_len=512),
        iter([request(0, 0.0, 20, 4, n=3), request(1, 5.0, 20, 4, n=3)]),
        block_size=pool.block_size,
    )
    noted = ForksNoted(engine.completions.kv)
    engine.completions.kv = noted
    engine.run()
    streams = [stream for _, stream in noted.children]
    assert len(streams) == 4 and all(isinstance(stream, int) and stream < 0 for stream in streams)
    assert len(set(streams)) == 4
    assert len({seq_id for seq_id, _ in noted.children}) == 4


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_samples_whose_fork_cannot_fit_are_preempted_without_any_swap(step_mode):
    """Pool 8 blocks of 4, 1 s per iteration, swap preemption at 1 s per block. At t=0 request 1
    (prompt 8: 2 blocks, output 12) and request 0 (prompt 12: 3 blocks, two samples of 4) are
    admitted and prefilled. Request 1 takes its first token (a 3rd block: 6 used); request 0's fork
    must copy its 3 prompt blocks (plain paging copies) into 2 free ones: it is preempted by
    recompute (samples restart from the prompt: never swapped), readmitted, and preempted again at
    the end of each of request 1's 12 iterations (request 1 holds 3 to 5 blocks: never 6 free). No
    swap is charged, so request 1 finishes at 12.0; then request 0 prefills (12-13), forks (6 blocks)
    and decodes its 3 more tokens: 16.0. Its first token stays the one of its first prefill."""
    pool = PoolSpec(32, 4, 32)
    engine = Engine(
        make_policy("paged", pool),
        ConstantCost(1.0, swap_block_s=1.0),
        EngineKnobs(max_model_len=32, step_mode=step_mode, preemption_mode="swap", swap_space_blocks=100),
        iter([request(1, 0.0, 8, 12), request(0, 0.0, 12, 4, n=2)]),
        block_size=pool.block_size,
    )
    engine.run()
    times = {r.request_id: (r.first_token_s, r.finish_s, r.preemptions) for r in engine.records}
    assert times == {1: (1.0, 12.0, 0), 0: (1.0, 16.0, 12)}
    assert engine.counters.swapped_out_blocks == 0


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_two_samples_taking_their_first_tokens_can_swap_out_two_victims(step_mode):
    """Pool 6 blocks of 4, 1 s per iteration, swap at 1 s per block. At t=0 request 0 (prompt 8:
    2 blocks, two samples of 3 tokens), requests 1 and 2 (prompt 4: 1 block each) are admitted and
    prefilled together (4 blocks). Request 0's fork copies its 2 prompt blocks (6 used); each sample's
    first token needs a block of its own: the first preempts the newest request (2) by swapping its
    block out, the second the next newest (1). Both swap-outs are charged to the next iteration:
    1 + 2 = 3 s, so request 0's second token comes at 4.0 and its last at 5.0."""
    pool = PoolSpec(24, 4, 24)
    engine = Engine(
        make_policy("paged", pool),
        ConstantCost(1.0, swap_block_s=1.0),
        EngineKnobs(max_model_len=24, step_mode=step_mode, preemption_mode="swap", swap_space_blocks=100),
        iter([request(0, 0.0, 8, 3, n=2), request(1, 0.0, 4, 3), request(2, 0.0, 4, 3)]),
        block_size=pool.block_size,
    )
    engine.run()
    records = {r.request_id: r for r in engine.records}
    assert (records[0].first_token_s, records[0].finish_s, records[0].preemptions) == (1.0, 5.0, 0)
    assert [records[i].preemptions for i in (1, 2)] == [1, 1]
    assert all(record.outcome == "finished" for record in records.values())
    assert (engine.counters.swapped_out_blocks, engine.counters.preemptions) == (2, 2)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_two_requests_whose_forks_fit_one_at_a_time_both_finish(step_mode):
    """Plain paging (a child copies its parent's blocks), blocks of 4, a pool of 23 blocks, a budget
    of 20 tokens an iteration. A and B: 24-token prompts (6 blocks), 3 samples of 2 tokens. Iteration
    1 (1.2 s: 1 s + 20 x 0.01) prefills 20 tokens of A; iteration 2 (1.2 s) the last 4 of A and 16 of
    B, admitted with its 6 blocks. A's prompt is done at 2.4 s and its two children need 12 blocks:
    11 are free. The newest request, B, is preempted; then they fit (17 free). A decodes its second
    token in iteration 3 (its samples take a block each: 21 held) and finishes at 3.4 s; B, which
    needs 6 blocks, waits until then, prefills 20 + 4 tokens (1.2 + 1.04 s: first token at 5.64 s),
    forks alone and finishes at 6.64 s. (kvsim used to preempt the forking request instead: A, then
    B at its own prompt's end, then A again, for ever.)"""
    pool = PoolSpec(23 * 4, 4, 64)
    requests = [request(0, 0.0, 24, 2, n=3), request(1, 0.0, 24, 2, n=3)]
    engine = Engine(
        make_policy("paged", pool),
        RoundCostModel(),
        EngineKnobs(max_model_len=64, max_num_batched_tokens=20, step_mode=step_mode),
        iter(requests),
        block_size=4,
    )
    engine.run(until_s=100.0)
    got = {record.request_id: record for record in engine.records}
    assert [(got[i].outcome, got[i].preemptions) for i in (0, 1)] == [("finished", 0), ("finished", 1)]
    assert got[0].first_token_s == pytest.approx(2.4) and got[0].finish_s == pytest.approx(3.4)
    assert got[1].first_token_s == pytest.approx(5.64) and got[1].finish_s == pytest.approx(6.64)
