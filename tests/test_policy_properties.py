"""Property-based tests: random admit / grow / fork / free / evict sequences against every policy."""

from __future__ import annotations

import copy
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import ChildSpec, OutOfKVMemory, PoolSpec, make_policy
from policies.contiguous import ContiguousPolicy
from policies.paged import PagedPolicy
from policies.prefix import PrefixCachingPolicy, block_contents
from sim.native import engine_build
from tests.test_contiguous import _check_invariants as check_contiguous_invariants
from tests.test_contiguous import _chunk, _expected_reservation
from tests.test_radix import check_against_recount as check_radix_against_recount

BLOCK_SIZE = 4
POOL = PoolSpec(kv_pool_tokens=30 * BLOCK_SIZE + 2, block_size=BLOCK_SIZE, max_model_len=48)

# A few prompts that share leading segments, so prefix hits happen often. A block-aligned prompt
# repeated may hit only all but its last block, so two blocks come to hold the same cache key.
PROMPTS = [
    ((1, 8),),
    ((1, 9),),
    ((1, 9), (2, 5)),
    ((1, 4), (3, 7)),
    ((1, 12), (4, 1)),
    ((5, 3),),
    ((1, 9), (2, 5), (6, 8)),
]

VARIANTS = [
    ("paged", {}),
    ("prefix", {}),
    ("prefix", {"pin": ((1, 9),)}),  # a warm-up prefix pinned first: hits on pinned blocks
    ("prefix", {"defer_keys": True}),  # prompts' blocks keyed as their chunks are scheduled (the engine's)
    ("contiguous", {"reservation": "max", "placement": "first_fit"}),
    ("contiguous", {"reservation": "pow2", "placement": "best_fit"}),
    ("contiguous", {"reservation": "oracle", "placement": "buddy"}),
    ("radix", {}),  # its tree is recounted independently in test_radix.py
    ("radix", {"page_size": 3}),
    ("radix", {"page_size": 3, "defer_keys": True}),  # prompts inserted as their chunks are scheduled
    # HiCache (a host pool of that many blocks, just over the device pool or more, and a write policy)
    ("radix", {"hicache": (31, "write_through")}),
    ("radix", {"page_size": 3, "hicache": (32, "write_back")}),
    ("radix", {"hicache": (40, "write_through_selective")}),
]


def expected_block_accounting(policy: PagedPolicy) -> dict[str, int]:
    """Recompute the breakdown from the block tables alone (independent of the incremental sums)."""
    block_size = policy.block_size
    filled: dict[int, int] = {}
    target: dict[int, int] = {}
    for seq_id in policy.live_sequences():
        state = policy.sequences[seq_id]
        for index, block_id in enumerate(state.block_table):
            fill = min(block_size, state.num_tokens - index * block_size)
            goal = min(block_size, max(0, state.final_len - index * block_size))
            filled[block_id] = fill
            target[block_id] = max(target.get(block_id, 0), goal)
    live = len(filled)
    cached = 0
    if isinstance(policy, PrefixCachingPolicy):
        cached = sum(
            1
            for block_id in range(policy.num_blocks)
            if policy.ref_count[block_id] == 0
            and (policy._block_key[block_id] is not None or block_id in policy._pinned)
        )
    return {
        "used": sum(filled.values()),
        "reserved": sum(target[b] - filled[b] for b in filled),
        "internal_fragmentation": live * block_size - sum(target.values()),
        "external_fragmentation": policy.pool.kv_pool_tokens - policy.num_blocks * block_size,
        "cached": cached * block_size,
        "free": (policy.num_blocks - live - cached) * block_size,
    }


def check_block_invariants(policy: PagedPolicy) -> None:
    references: Counter[int] = Counter()
    for seq_id in policy.live_sequences():
        table = policy.sequences[seq_id].block_table
        assert len(table) == len(set(table)), "a sequence holds the same block twice"
        assert len(table) == -(-policy.sequences[seq_id].num_tokens // policy.block_size)
        references.update(table)
    for block_id in range(policy.num_blocks):
        assert policy.ref_count[block_id] == references[block_id] >= 0
        in_queue = block_id in policy.free_queue
        pinned_idle = isinstance(policy, PrefixCachingPolicy) and block_id in policy._pinned
        assert in_queue == (references[block_id] == 0 and not pinned_idle)
    assert policy.breakdown().as_dict() == expected_block_accounting(policy)
    for seq_id in policy.live_sequences():
        state = policy.sequences[seq_id]
        room = policy.growth_room(seq_id)
        tail_shared = (
            bool(state.num_tokens % policy.block_size) and policy.ref_count[state.block_table[-1]] > 1
        )
        allocated = len(state.block_table) * policy.block_size
        assert room == (0 if tail_shared else min(allocated, state.final_len) - state.num_tokens)
        if room:
            assert policy.slots_needed_to_grow(seq_id, room) == 0
        if state.num_tokens < state.final_len and room < state.final_len - state.num_tokens:
            assert policy.slots_needed_to_grow(seq_id, room + 1) > 0
    logical = sum(len(policy.sequences[s].block_table) for s in policy.live_sequences())
    assert policy.sharing_slots() == (len(references) * policy.block_size, logical * policy.block_size)
    shared_blocks = sum(1 for count in references.values() if count >= 2)
    assert policy.shared_slots() == shared_blocks * policy.block_size
    if isinstance(policy, PrefixCachingPolicy):
        check_blocks_hold_the_content_of_their_owners(policy)
        check_content_chains_are_exactly_those_held(policy)


def check_blocks_hold_the_content_of_their_owners(policy: PrefixCachingPolicy) -> None:
    """Every full block a sequence holds is keyed by the content chain the sequence's own tokens spell
    (recomputed here from its segments), exactly as a lookup of the same content computes the key:
    sharing, by hit or by fork, never shares wrong content."""
    for seq_id in policy.live_sequences():
        state = policy.sequences[seq_id]
        full = min(state.num_tokens, state.publish_limit) // policy.block_size
        # Blocks past what was scheduled are its own, and hold no key (nothing can hit them).
        unpublished = state.block_table[full : state.num_tokens // policy.block_size]
        assert all(policy._block_key[block] is None for block in unpublished)
        assert all(policy.ref_count[block] == 1 for block in unpublished)
        state.fold_output()
        contents = block_contents(state.segments, state.segment_ends, 0, full, policy.block_size)
        parent_chain = None
        for index, (block_id, content) in enumerate(zip(state.block_table[:full], contents, strict=True)):
            key = (parent_chain, *content, state.namespace)
            if state.lazy_key is not None and index == state.lazy_from:
                # A lazy run from here: filed under this key, which nothing holds; its blocks marked.
                assert policy._lazy_runs[key] is state and key == state.lazy_key
                assert policy._chains.find(key) is None and key not in policy._cached_by_key
                assert all(policy._block_key[block] is state for block in state.block_table[index:full])
                break
            chain = policy._chains.find(key)
            assert chain is not None and policy._block_chain[block_id] == chain
            assert policy._block_key[block_id] == key
            parent_chain = chain


def check_content_chains_are_exactly_those_held(policy: PrefixCachingPolicy) -> None:
    """A content-chain id lives exactly while something holds it: a keyed block (cached or live), the
    host tier, or a lazy run (its first key's parent), and in turn the parent each key names. An id
    kept after its last holder went (an eviction that released nothing) would leak, and make content
    look held that no block holds."""
    entries = policy._chains._entry_of
    held: set[int] = set()

    def hold(chain: int | None) -> None:
        while chain is not None and chain not in held:
            held.add(chain)
            chain = entries[chain].key[0]  # the parent its key names

    for block_id in range(policy.num_blocks):
        if isinstance(policy._block_key[block_id], tuple):
            hold(policy._block_chain[block_id])
    for first_key in policy._lazy_runs:
        hold(first_key[0])
    if policy.host_tier is not None:
        for key in policy.host_tier.keys_oldest_first():
            hold(policy.host_tier.chain_of(key))
    assert set(entries) == held


class Driver:
    """Applies admit / grow / fork / free / evict operations to one policy and checks every invariant
    after each one. The hypothesis test below draws the operations; ``make fuzz`` (``tests/fuzz.py``)
    draws millions from a seeded generator: both go through this class, so they check the same things.

    Checks after every operation: the breakdown sums to the pool; a failed operation changes nothing;
    ``lookup`` changes nothing and predicts the hit ``admit`` then takes; paged policies: block tables,
    reference counts, the free queue, growth room, sharing, content chains and the breakdown recomputed
    from the block tables; contiguous: the regions and holes tile the pool and the breakdown matches an
    independent model of the sequences (``tests/test_contiguous.py``); radix: the tree, locks and
    breakdown recounted from the sequences (``tests/test_radix.py``).

    ``evict``: on a prefix cache, admit fresh content larger than the uncached free blocks (which forces
    LRU eviction) and free it again; on policies without a cache, free the newest sequence, as a
    preemption does."""

    KINDS = (
        "admit",
        "schedule",
        "grow",
        "grow_each",
        "fork",
        "free",
        "preempt",
        "match",
        "decode_step",
        "evict",
    )

    def __init__(self, name: str, options: dict, pool: PoolSpec = POOL, prompts: list = PROMPTS):
        options = dict(options)
        pinned = options.pop("pin", None)
        hicache = options.pop("hicache", None)
        defer_keys = options.pop("defer_keys", False)
        self.policy = make_policy(name, pool, **options)
        if defer_keys:
            assert self.policy.defer_prompt_keys()
        if hicache is not None:
            self.policy.enable_host_tier(*hicache)
        if pinned is not None:
            self.policy.pin_prefix(pinned)
        self.pool, self.prompts = pool, prompts
        self.live: list[int] = []
        self.model: dict[int, list[int]] = {}  # seq_id -> [prompt_len, final_len, length]
        self.next_id = 0
        self.done: Counter[str] = Counter()  # operations that succeeded, by kind
        self.failed: Counter[str] = Counter()  # operations refused with OutOfKVMemory, by kind
        self.contiguous = isinstance(self.policy, ContiguousPolicy)
        self.has_cache = self.policy.name in ("prefix", "radix")
        if self.contiguous:
            initial = pool.max_model_len if self.policy.reservation == "max" else 1
            self.reference = _chunk(self.policy.placement, initial)

    def _fresh_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _region(self, prompt_len: int, final_len: int) -> int:
        policy = self.policy
        size = _expected_reservation(policy.reservation, prompt_len, final_len, self.pool.max_model_len)
        return _chunk(policy.placement, size)

    def apply(self, kind: str, choice: int, amount: int) -> None:
        policy = self.policy
        before = policy.breakdown()
        try:
            applied = getattr(self, f"_{kind}")(choice, amount)
        except OutOfKVMemory:
            assert policy.breakdown() == before, "a failed operation changed the pool"
            self.failed[kind] += 1
        else:
            if applied:
                self.done[kind] += 1
        self.check()

    def _admit(self, choice: int, amount: int) -> bool:
        policy = self.policy
        prompt = self.prompts[choice % len(self.prompts)]
        prompt_len = sum(length for _, length in prompt)
        final_len = min(prompt_len + amount, self.pool.max_model_len)
        seq_id = self._fresh_id()
        before = policy.breakdown()
        hit = policy.lookup(prompt)
        assert policy.breakdown() == before, "lookup changed the pool"
        # Paged policies: can_admit predicts admit exactly (contiguous ones remember what they checked).
        fits = policy.can_admit(prompt, final_len) if isinstance(policy, PagedPolicy) else None
        try:
            cached = policy.admit(seq_id, prompt, final_len, output_content_id=1000 + seq_id)
        except OutOfKVMemory as error:
            assert error.prefix_hit == hit and fits is not True
            raise
        assert fits is not False
        assert cached == hit.total_tokens  # the GPU hit, plus what a host tier loads back
        hit_unit = getattr(policy, "page_size", self.pool.block_size)  # radix hits whole pages, others blocks
        assert 0 <= cached < prompt_len and cached % hit_unit == 0
        self.live.append(seq_id)
        self.model[seq_id] = [prompt_len, final_len, prompt_len]
        if self.contiguous:
            self.reference = self._region(prompt_len, final_len)
        return True

    def _schedule(self, choice: int, amount: int) -> bool:
        """The engine schedules the next chunk of a live sequence's content (after
        ``defer_prompt_keys``: its full blocks become hittable, or enter the radix tree; otherwise
        nothing changes). Nothing is taken: only an insertion that finds its tokens in the tree
        already gives the sequence's copies back (used or cached to free)."""
        if not self.live:
            return False
        seq_id = self.live[choice % len(self.live)]
        policy = self.policy
        before = policy.breakdown()
        policy.prompt_scheduled(seq_id, 1 + amount)
        after = policy.breakdown()
        unchanged = (before.reserved, before.internal_fragmentation, before.external_fragmentation)
        assert (after.reserved, after.internal_fragmentation, after.external_fragmentation) == unchanged
        assert after.free >= before.free and after.used <= before.used, f"{before} -> {after}"
        if not self.has_cache or policy.name == "prefix":
            assert after == before, f"scheduling a chunk moved slots: {before} -> {after}"
        return True

    def _grow(self, choice: int, amount: int) -> bool:
        if not self.live:
            return False
        seq_id = self.live[choice % len(self.live)]
        prompt_len, final_len, length = self.model[seq_id]
        grown = min(amount, final_len - length)
        if grown == 0:
            return False
        paged = isinstance(self.policy, PagedPolicy)
        state = self.policy.sequences[seq_id] if paged else None
        self.policy.grow(seq_id, grown)
        self.model[seq_id][2] += grown
        if state is not None:
            _assert_written_blocks_are_private(self.policy, state, grown)
        return True

    def _grow_each(self, choice: int, amount: int) -> bool:
        if not self.live:
            return False
        group = _grow_each_as_one_at_a_time(self.policy, self.live, choice, amount)
        for seq_id, grown in group:
            self.model[seq_id][2] += grown
        return bool(group)

    def _fork(self, choice: int, amount: int) -> bool:
        if not self.live:
            return False
        parent = self.live[choice % len(self.live)]
        prompt_len, _, length = self.model[parent]
        final_len = min(self.pool.max_model_len, length + 5)
        first = self.next_id + 1
        children = [ChildSpec(first + i, final_len, 5000 + i) for i in range(max(1, amount % 4))]
        self.policy.fork(parent, children)
        self.next_id += len(children)
        for child in children:
            self.live.append(child.seq_id)
            self.model[child.seq_id] = [prompt_len, final_len, length]
        if self.contiguous:
            self.reference = self._region(prompt_len, final_len)
        return True

    def _free(self, choice: int, amount: int) -> bool:
        if not self.live:
            return False
        seq_id = self.live.pop(choice % len(self.live))
        self.policy.free(seq_id)
        del self.model[seq_id]
        return True

    def _preempt(self, choice: int, amount: int) -> bool:
        """Free a sequence that did not finish (a preemption, a retraction, an abort)."""
        if not self.live:
            return False
        seq_id = self.live.pop(choice % len(self.live))
        self.policy.free(seq_id, finished=False)
        del self.model[seq_id]
        return True

    def _match(self, choice: int, amount: int) -> bool:
        """The scheduler's match of a waiting prompt: ``lookup``'s hit; no slot moves, nothing counted."""
        policy = self.policy
        prompt = self.prompts[choice % len(self.prompts)]
        before, stats = policy.breakdown(), policy.stats.as_dict()
        hit = policy.lookup(prompt)
        assert policy.match(prompt) == hit
        assert policy.breakdown() == before and policy.stats.as_dict() == stats
        return True

    def _decode_step(self, choice: int, amount: int) -> bool:
        """A decode step of the live sequences prepares its room: only cached and free slots may move."""
        policy = self.policy
        before = policy.breakdown()
        policy.prepare_decode_step(len(self.live))
        after = policy.breakdown()
        assert (after.used, after.reserved, after.internal_fragmentation) == (
            before.used,
            before.reserved,
            before.internal_fragmentation,
        )
        return True

    def _evict(self, choice: int, amount: int) -> bool:
        policy = self.policy
        if not self.has_cache:
            return self._free(len(self.live) - 1, amount)  # the newest, as a preemption frees it
        # Fresh content a little larger than the uncached free slots: admitting it must evict.
        unit = getattr(policy, "page_size", self.pool.block_size)
        wanted = policy.breakdown().free + unit * (1 + choice % 3)
        length = max(unit, min(wanted, self.pool.max_model_len) // unit * unit)
        seq_id = self._fresh_id()
        policy.admit(seq_id, ((900_000 + seq_id, length),), length, output_content_id=seq_id)
        policy.free(seq_id)
        return True

    def check(self) -> None:
        policy = self.policy
        assert policy.breakdown().total == self.pool.kv_pool_tokens
        if isinstance(policy, PagedPolicy):
            check_block_invariants(policy)
        elif self.contiguous:
            check_contiguous_invariants(
                policy, self.model, self.pool.kv_pool_tokens, self.reference, policy.placement
            )
        else:
            check_radix_against_recount(policy)  # the tree and sequences recounted (tests/test_radix.py)

    def drain(self) -> None:
        """Free everything: the pool holds nothing live; a cache is drained by one fresh admission."""
        while self.live:
            self._free(0, 0)
        final = self.policy.breakdown()
        assert final.used == final.reserved == final.internal_fragmentation == 0
        assert final.cached + final.free + final.external_fragmentation == self.pool.kv_pool_tokens
        self.check()
        if self.has_cache or isinstance(self.policy, PagedPolicy):
            seq_id = self._fresh_id()
            length = self.pool.max_model_len
            self.policy.admit(seq_id, ((999_999, length),), length, output_content_id=1)
            self.policy.free(seq_id)
            assert self.policy.breakdown().used == 0


operation = st.tuples(st.sampled_from(Driver.KINDS), st.integers(0, 50), st.integers(0, 20))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=st.sampled_from(VARIANTS), operations=st.lists(operation, max_size=60))
def test_random_operations_keep_every_invariant(variant, operations):
    name, options = variant
    driver = Driver(name, options)
    for kind, choice, amount in operations:
        driver.apply(kind, choice, amount)
    driver.drain()


def _final_len(policy, seq_id: int) -> int:
    return policy.final_len(seq_id)


def _grow_each_as_one_at_a_time(policy, live: list[int], choice: int, amount: int) -> list[tuple[int, int]]:
    """grow_each of up to three live sequences (often a parent and its forks, sharing a tail) leaves
    the policy exactly as growing them one at a time would, and returns each one's growth room; when
    it fails, nothing changed."""
    if amount <= 0:
        return []
    start = choice % len(live)
    group = [
        seq_id for seq_id in live[start : start + 3] if policy.seq_len(seq_id) < _final_len(policy, seq_id)
    ]
    if not group:
        return []
    tokens = [min(amount, _final_len(policy, seq_id) - policy.seq_len(seq_id)) for seq_id in group]
    # Compiled policies cannot be deep-copied: the one-at-a-time reference then runs with the sources.
    reference = copy.deepcopy(policy) if engine_build() == "python" else None
    before = _snapshot(policy, live)
    failures = policy.stats.allocation_failures
    try:
        rooms = policy.grow_each(group, tokens)
    except OutOfKVMemory:
        # Nothing changed but the count of failed allocations.
        assert policy.stats.allocation_failures == failures + 1
        policy.stats.allocation_failures = failures
        assert _snapshot(policy, live) == before, "a failed grow_each changed the policy"
        raise
    if reference is not None:
        for seq_id, count in zip(group, tokens, strict=True):
            reference.grow(seq_id, count)
        assert rooms == [reference.growth_room(seq_id) for seq_id in group]
        assert _snapshot(policy, live) == _snapshot(reference, live)
    return list(zip(group, tokens, strict=True))


def _snapshot(policy, live: list[int]) -> tuple:
    sequences = [(policy.seq_len(s), policy.growth_room(s)) for s in live]
    tables = [policy.block_table(s) for s in live] if isinstance(policy, PagedPolicy) else []
    order = policy.free_queue.order() if isinstance(policy, PagedPolicy) else []
    return policy.breakdown(), policy.sharing_slots(), policy.stats.as_dict(), sequences, tables, order


def _assert_written_blocks_are_private(policy: PagedPolicy, state, grown: int) -> None:
    """Copy-on-write: every block a write touched belongs to the writer alone."""
    first_written = (state.num_tokens - grown) // policy.block_size
    for block_id in state.block_table[first_written:]:
        assert policy.ref_count[block_id] == 1
