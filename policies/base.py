"""The one interface between the engine and every KV-cache allocation policy.

The engine (``sim/``) only ever calls the methods of :class:`KVCachePolicy`; each policy owns its
memory and reports it as a :class:`MemoryBreakdown` that sums exactly to the pool at every instant.

Vocabulary (see ``design.md``): a *slot* holds one token's K and V in every layer; a *block* is
``block_size`` slots; the *pool* is every slot of the KV cache. A *sequence* is one stream of tokens
(a request has one, or several after a fork). Token content is carried compactly as *segments*
(``token_content``, shared with the workloads that produce it).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import ClassVar, Final, Generic, Protocol, TypeVar

from mypy_extensions import mypyc_attr

from policies._host_tier import HostPool
from token_content import TokenContent, content_length, validate_content

# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


class PolicyError(Exception):
    """Base class for errors a policy raises."""


class PolicyInputError(PolicyError, ValueError):
    """A caller passed an impossible value (bad size, unknown sequence, double free...).

    The policy's state is unchanged when this is raised."""


# A sequence's scheduled tokens once its whole content is (KVCachePolicy.prompt_scheduled): a prompt
# allocated at admission is cached, or inserted, only as far as its chunks were scheduled.
ALL_PUBLISHED: Final = 1 << 61  # (below 2**62: compiled, a native int, not a boxed one)


def scheduled_mark(mark: int, tokens: int, num_tokens: int) -> int:
    """A sequence of ``num_tokens`` tokens scheduled as far as ``mark``, told that its first
    ``tokens`` are: how far it is scheduled now (:data:`ALL_PUBLISHED` once all of it is; ``mark``
    itself when the report tells nothing new)."""
    if tokens <= mark:
        return mark
    return ALL_PUBLISHED if tokens >= num_tokens else tokens


@dataclass(frozen=True, init=False)
class PrefixHit:
    """What a prefix-cache lookup found for a prompt: ``cached_tokens`` tokens need no prefill.

    ``block_ids`` are the cached blocks the hit would reuse, in prompt order (block-based caches);
    empty for policies that do not hand out block ids (no cache, or the token-granular radix tree).
    ``host_tokens`` follow the GPU hit: tokens the host-memory tier holds, which admission loads back
    (``offload:``; 0 without a host tier). (Its constructor is written out: compiled, it runs
    natively, where a dataclass's generated one stays interpreted; one is built per lookup.)"""

    cached_tokens: int
    block_ids: tuple[int, ...]
    host_tokens: int

    def __init__(self, cached_tokens: int, block_ids: tuple[int, ...] = (), host_tokens: int = 0) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "cached_tokens", cached_tokens)
        setattr_(self, "block_ids", block_ids)
        setattr_(self, "host_tokens", host_tokens)

    @property
    def total_tokens(self) -> int:
        """Prompt tokens that need no prefill: the GPU hit plus the host hit."""
        return self.cached_tokens + self.host_tokens


NO_HIT = PrefixHit(0)


class OutOfKVMemory(PolicyError):
    """The pool cannot hold what was asked for right now. State is unchanged.

    ``needed_slots`` / ``free_slots`` say by how much, so the engine can log an honest OOM.
    ``prefix_hit`` is the prefix-cache hit a failed admission computed before it learned that the
    allocation fails (vLLM's scheduler also looks the prefix up first); :data:`NO_HIT` otherwise."""

    def __init__(self, message: str, needed_slots: int, free_slots: int, prefix_hit: PrefixHit = NO_HIT):
        # Every argument in ``args``: SimPy re-raises a process's exception as ``type(e)(*e.args)``.
        super().__init__(message, needed_slots, free_slots, prefix_hit)
        self.message = message
        self.needed_slots = needed_slots
        self.free_slots = free_slots
        self.prefix_hit = prefix_hit

    def __str__(self) -> str:
        return self.message


# --------------------------------------------------------------------------------------------------
# Pool description, breakdown, statistics
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolSpec:
    """What every policy is built from; the engine derives it from model, GPU and knobs."""

    kv_pool_tokens: int
    block_size: int
    max_model_len: int
    kv_bytes_per_token: int = 1

    def __post_init__(self) -> None:
        for name in ("kv_pool_tokens", "block_size", "max_model_len", "kv_bytes_per_token"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise PolicyInputError(f"PoolSpec.{name} must be a positive integer, got {value!r}")
        if self.kv_pool_tokens < self.block_size:
            raise PolicyInputError(
                f"PoolSpec.kv_pool_tokens={self.kv_pool_tokens} is smaller than one block "
                f"(block_size={self.block_size})"
            )

    @property
    def kv_pool_blocks(self) -> int:
        return self.kv_pool_tokens // self.block_size


@mypyc_attr(native_class=False)  # a plain class when compiled: mypyc would take CATEGORIES for a field
@dataclass(frozen=True)
class MemoryBreakdown:
    """Where every slot of the pool is, in slots. Sums to ``pool_slots`` exactly.

    The categories are the vLLM paper's Figure 2 (token states, reservation, internal and external
    fragmentation) plus the prefix cache and plain free memory."""

    used: int
    reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    cached: int
    free: int

    CATEGORIES: ClassVar[tuple[str, ...]] = (
        "used",
        "reserved",
        "internal_fragmentation",
        "external_fragmentation",
        "cached",
        "free",
    )

    @property
    def total(self) -> int:
        return (
            self.used
            + self.reserved
            + self.internal_fragmentation
            + self.external_fragmentation
            + self.cached
            + self.free
        )

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.CATEGORIES}

    def in_bytes(self, kv_bytes_per_token: int) -> dict[str, int]:
        return {f"{name}_bytes": value * kv_bytes_per_token for name, value in self.as_dict().items()}


@dataclass(init=False)
class PolicyStats:
    """Cumulative counters. Names follow vLLM's metrics where vLLM has one (tokens, not blocks).
    (Its constructor is written out: compiled, it runs natively; a pool of several groups builds
    one whenever the engine reads its counters.)"""

    prefix_cache_queries: int
    prefix_cache_hits: int
    evictions: int
    cow_copies: int  # blocks copied because a shared, partly filled block was written
    fork_copied_tokens: int  # tokens physically copied by forks that cannot share
    allocation_failures: int

    def __init__(
        self,
        prefix_cache_queries: int = 0,
        prefix_cache_hits: int = 0,
        evictions: int = 0,
        cow_copies: int = 0,
        fork_copied_tokens: int = 0,
        allocation_failures: int = 0,
    ) -> None:
        self.prefix_cache_queries = prefix_cache_queries
        self.prefix_cache_hits = prefix_cache_hits
        self.evictions = evictions
        self.cow_copies = cow_copies
        self.fork_copied_tokens = fork_copied_tokens
        self.allocation_failures = allocation_failures

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# --------------------------------------------------------------------------------------------------
# The interface
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChildSpec:
    """A sequence created by :meth:`KVCachePolicy.fork`: it inherits the parent's tokens, then
    generates its own stream ``output_content_id`` up to ``final_len`` tokens in total."""

    seq_id: int
    final_len: int
    output_content_id: int


# Not an ABC: compiled by mypyc, ABCs share one isinstance cache (a negative answer for one policy
# class would then poison the others); register() checks the abstract methods instead.
@mypyc_attr(allow_interpreted_subclasses=True)  # compiled, it still takes policies written in Python
class KVCachePolicy:
    """A KV-cache allocator. Every method either succeeds or raises and leaves the state unchanged
    (a failed admission may still have recorded its prefix match as a cache access, see :meth:`match`;
    the breakdown never changes).

    Lengths are in tokens (= slots). ``final_len`` is the length the sequence will reach when it
    finishes: the simulator knows it, and the breakdown uses it to tell reservation (slots that will
    be filled) from internal fragmentation (slots that never will)."""

    name: ClassVar[str] = ""
    # False for a policy with no blocks (a linear address space): block_size changes nothing it does,
    # so a plan does not cross it with block sizes.
    uses_blocks: ClassVar[bool] = True
    host_tier: HostPool | None = None
    """The host-memory tier of evicted cached blocks, once :meth:`enable_host_tier` made one."""

    @classmethod
    def pool_slots_from_memory(cls, memory_slots: int, block_size: int, options: Mapping[str, object]) -> int:
        """The pool this policy manages, out of the ``memory_slots`` token slots the KV memory holds,
        given the engine's ``block_size`` and the policy's own ``options``.

        Block-based policies hold whole blocks, as vLLM sizes ``num_gpu_blocks``; a policy with
        another unit (contiguous slots, SGLang pages) overrides this."""
        return memory_slots // block_size * block_size

    # Speculative decoding: whether the policy can hold slots beyond a sequence's tokens for the
    # drafts of its next step (:meth:`hold_lookahead`).
    HOLDS_LOOKAHEAD: ClassVar[bool] = False

    def __init__(self, pool: PoolSpec):
        self.pool = pool
        self.stats = PolicyStats()
        self.lookahead_slots = 0

    def hold_lookahead(self, slots: int) -> None:
        """From now on every decoding sequence holds ``slots`` slots beyond its tokens (speculative
        decoding's drafts and vLLM's lookahead), within a final length that counts them: the engine
        admits a sequence with ``final_len`` = its last token + ``slots``. Before any admission."""
        if not self.HOLDS_LOOKAHEAD:
            raise PolicyInputError(
                f"{type(self).__name__} cannot hold lookahead slots for speculative decoding"
            )
        if slots < 0:
            raise PolicyInputError(f"lookahead slots must be >= 0, got {slots}")
        self.lookahead_slots = slots

    # -- sequences ---------------------------------------------------------------------------------
    @abstractmethod
    def can_admit(self, prompt: TokenContent, final_len: int, namespace: int = 0) -> bool:
        """Would :meth:`admit` (with the same ``namespace``) succeed right now? Changes nothing but
        what a policy notes of the request it was asked about (contiguous: the reference of its
        external fragmentation): the scheduler asks before it admits."""

    def can_admit_quietly(self, prompt: TokenContent, final_len: int, namespace: int = 0) -> bool:
        """:meth:`can_admit` as a reading (the engine's report of what holds the queue back): not even
        a note is left. Single steps read the queue's head at every iteration, skipped ones not, so
        a note left by a reading would make the step modes report different memory."""
        return self.can_admit(prompt, final_len, namespace)

    def lookup(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        """The prefix-cache hit :meth:`admit` would get for ``prompt`` now, changing nothing (no
        statistics, no LRU refresh, no node split). The hit never covers the prompt's last token,
        which must be computed to produce logits (vLLM's and SGLang's ``len - 1`` cap).

        Policies without a prefix cache never hit."""
        validate_content(prompt, "looked-up prompt", PolicyInputError)
        return NO_HIT

    @abstractmethod
    def admit(
        self, seq_id: int, prompt: TokenContent, final_len: int, output_content_id: int, namespace: int = 0
    ) -> int:
        """Allocate a new sequence holding ``prompt``. Returns prompt tokens served from cache.

        ``namespace`` separates caches that must not share (a LoRA adapter, a cache salt); policies
        without a cache ignore it. Raises :class:`OutOfKVMemory` when it does not fit now."""

    def admit_capped(
        self,
        seq_id: int,
        prompt: TokenContent,
        final_len: int,
        output_content_id: int,
        namespace: int,
        max_cached_tokens: int,
    ) -> int:
        """:meth:`admit`, serving at most ``max_cached_tokens`` prompt tokens from cache: the KV
        coordinator's common hit when this policy manages one KV group beside others whose caches
        hold a shorter prefix (every group must hold the tokens the request skips).

        Default: :meth:`admit` when the policy's own hit is within the cap; a policy that cannot
        shorten its hit refuses, changing nothing."""
        own_hit = self.lookup(prompt, namespace).total_tokens
        if own_hit > max_cached_tokens:
            raise PolicyInputError(
                f"policy {self.name!r} cannot serve a prefix hit shorter than its own ({own_hit} tokens) "
                f"to match the other KV groups' {max_cached_tokens}"
            )
        return self.admit(seq_id, prompt, final_len, output_content_id, namespace)

    def can_admit_capped(
        self, prompt: TokenContent, final_len: int, namespace: int, max_cached_tokens: int
    ) -> bool:
        """Would :meth:`admit_capped` with the same cap succeed right now? Changes nothing."""
        return self.lookup(prompt, namespace).total_tokens <= max_cached_tokens and self.can_admit(
            prompt, final_len, namespace
        )

    @abstractmethod
    def grow(self, seq_id: int, num_tokens: int, content: TokenContent | None = None) -> None:
        """Append ``num_tokens`` tokens (the sequence's own output stream unless ``content`` is
        given). Raises :class:`OutOfKVMemory` (an OOM the engine must handle)."""

    def grow_each(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> list[int]:
        """:meth:`grow` ``seq_ids[i]`` by ``num_tokens[i]`` tokens of its own output, in order, and
        return each one's :meth:`growth_room` afterwards: what the engine does whenever sequences'
        held slots run out, in one call however many there are.

        All or nothing: raises and changes nothing if a sequence is unknown, listed twice or would
        pass its final length, or if the pool may not hold them all (:meth:`slots_needed_to_grow`
        summed, so a shared tail that only its first writer copies counts for every sharer)."""
        self._check_grow_each(seq_ids, num_tokens)
        for seq_id, tokens in zip(seq_ids, num_tokens):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
            self.grow(seq_id, tokens)
        return [self.growth_room(seq_id) for seq_id in seq_ids]

    def _check_grow_each(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> None:
        if len(seq_ids) != len(num_tokens) or len(set(seq_ids)) != len(seq_ids):
            raise grow_each_arguments_error(seq_ids, num_tokens)
        needed = 0
        for seq_id, tokens in zip(seq_ids, num_tokens):  # noqa: B905 (lengths checked above; compiled, strict=True costs a call with keywords)
            self._check_growth(seq_id, tokens, self.seq_len(seq_id), self.final_len(seq_id))
            needed += self.slots_needed_to_grow(seq_id, tokens)
        available = self.available_slots()
        if needed > available:
            raise self._allocation_failure(
                f"growing sequences {list(seq_ids)} needs {needed} slots, {available} available",
                needed,
                available,
            )

    @abstractmethod
    def fork(self, parent_id: int, children: Sequence[ChildSpec]) -> None:
        """Create ``children`` holding the parent's tokens (parallel sampling, beam search)."""

    @abstractmethod
    def free(self, seq_id: int, finished: bool = True) -> None:
        """Release a sequence. Its blocks may stay cached (prefix policies).

        ``finished`` says why: True when it generated its last token, False when the engine preempts,
        retracts or aborts it. A policy may cache only finished sequences' tokens (SGLang frees a
        retracted request's KV without inserting it into its tree); the others ignore it."""

    def match(self, prompt: TokenContent, namespace: int = 0) -> PrefixHit:
        """The scheduler's prefix match of a waiting request: the hit :meth:`lookup` returns, but a
        policy may record the match as an access of its cache whether or not the request is then
        admitted (SGLang's ``match_prefix`` at scheduling splits a node and refreshes access times).
        It never changes the breakdown or the statistics. Default: :meth:`lookup`."""
        return self.lookup(prompt, namespace)

    def prepare_decode_step(self, num_sequences: int) -> None:
        """A decode step of ``num_sequences`` sequences is about to take its tokens: a policy may
        make room for them first (SGLang's paged decode allocation evicts from its tree until a page
        per sequence is free). It changes neither used nor reserved slots. Default: nothing."""

    # -- growth the pool does not back ------------------------------------------------------------
    def can_defer_unbacked(self) -> bool:
        """Can the engine defer this pool's decode growth past the slots its sequences hold? A pool
        whose sequences hold no room past their next token (SGLang's pages of one token) would be
        told of every decoded token; instead the engine counts them (:meth:`defer_unbacked`) and the
        pool takes them from its free slots when it is next asked anything, evicting what it would
        have evicted token by token. Default: no."""
        return False

    def defer_prompt_keys(self) -> bool:
        """From now on make a prompt's blocks hittable only as the engine reports its chunks
        scheduled (:meth:`prompt_scheduled`), not at admission. Returns whether this policy does;
        one that caches nothing, or keys its prompts at admission, returns False and is told
        nothing."""
        return False

    def prompt_scheduled(self, seq_id: int, tokens: int) -> None:
        """The first ``tokens`` tokens of ``seq_id``'s admitted content are scheduled (computed in
        this step or before): their full blocks may be cached from now on (after
        :meth:`defer_prompt_keys`)."""

    def defer_unbacked(self, pending_tokens: Callable[[], int] | None) -> None:
        """From now on take decode growth unbacked, ``pending_tokens`` reading how many decoded
        tokens no slot holds yet (the engine's decode clock); None: back to growth told token by
        token. The engine calls it only where :meth:`can_defer_unbacked`, with every decoding
        sequence told of its tokens up to the previous iteration."""
        raise PolicyInputError(f"policy {self.name!r} cannot defer decode growth past its held slots")

    def evict_for_unbacked(self, ahead_tokens: int) -> int:
        """While growth is unbacked: evict what ``ahead_tokens`` more decoded tokens would have
        evicted by the time they are taken, and return the free slots left once the pending ones
        are taken (the ``ahead_tokens`` not counted). The engine places those evictions at the
        iterations they fall in inside a jump."""
        raise PolicyInputError(f"policy {self.name!r} cannot defer decode growth past its held slots")

    # -- capacity and accounting -------------------------------------------------------------------
    @abstractmethod
    def breakdown_values(self) -> tuple[int, int, int, int, int, int]:
        """The breakdown as a plain tuple in :attr:`MemoryBreakdown.CATEGORIES` order. The engine
        reads it after every event, so it must be O(1) from running sums (or O(log) at worst)."""

    def breakdown(self) -> MemoryBreakdown:
        """Where every slot is now. Sums to :attr:`pool_slots`."""
        return MemoryBreakdown(*self.breakdown_values())

    @abstractmethod
    def slots_needed_to_grow(self, seq_id: int, num_tokens: int) -> int:
        """New slots the pool must supply for ``grow(seq_id, num_tokens)``: 0 when it fits in what the
        sequence already holds."""

    @abstractmethod
    def growth_room(self, seq_id: int) -> int:
        """Tokens the sequence can still take without the pool supplying anything: slots it already
        holds (0 when its next write must first copy a shared block). The engine defers growth
        that fits here, so event skipping costs nothing per token."""

    @abstractmethod
    def available_slots(self) -> int:
        """Slots that growth can take right now (free plus evictable cache)."""

    def available_slots_with_hit_locked(self, prompt: TokenContent) -> int:
        """:meth:`available_slots` less the evictable slots that admitting ``prompt`` would lock (its
        prefix hit's tokens no sequence holds). Default: :meth:`available_slots` (SGLang's
        scheduler, which asks it, locks a hit in its radix tree: ``radix`` overrides this)."""
        return self.available_slots()

    @abstractmethod
    def seq_len(self, seq_id: int) -> int:
        """Tokens the sequence holds now."""

    @abstractmethod
    def final_len(self, seq_id: int) -> int:
        """The length the sequence will reach (given at admission or fork)."""

    @abstractmethod
    def live_sequences(self) -> Iterable[int]:
        """Ids of the sequences currently allocated."""

    def sharing_slots(self) -> tuple[int, int]:
        """``(physical, logical)``: slots live sequences hold, and slots they would hold if nothing were
        shared. ``1 - physical / logical`` is the memory saved by sharing. Without sharing they match."""
        used, reserved, internal, _, _, _ = self.breakdown_values()
        allocated = used + reserved + internal
        return allocated, allocated

    def shared_slots(self) -> int:
        """Slots that two or more live sequences hold, each counted once: the K/V a decode step could
        read once for all of them. 0 where nothing is shared, or the policy does not track it."""
        return 0

    def may_share(self) -> bool:
        """Whether two sequences can ever hold one slot (a prefix cache, forks sharing blocks): where
        not, nothing asks what is shared."""
        return False

    @property
    def pool_slots(self) -> int:
        return self.pool.kv_pool_tokens

    def pin_prefix(self, prompt: TokenContent) -> int:
        """Keep ``prompt``'s blocks resident forever (warm-up). Returns slots pinned.

        Only prefix-caching policies can; the others raise, so a config that asks for pinning on a
        policy without a cache fails loudly instead of silently doing nothing."""
        raise PolicyInputError(f"policy {self.name!r} has no prefix cache: it cannot pin prefixes")

    def enable_host_tier(self, capacity_blocks: int, write_policy: str | None = None) -> None:
        """Keep cached blocks the GPU evicts in a host-memory LRU tier of ``capacity_blocks`` blocks
        (of the engine's ``block_size``), from which later prefix hits are loaded back (``offload:``).
        ``write_policy`` says when GPU content is copied to host (``offload.write_policy``; None: the
        policy's default). Only the prefix-caching policies have one; the others raise, so a config
        asking for it fails before anything runs."""
        raise PolicyInputError(
            f"policy {self.name!r} cannot keep evicted blocks in host memory (offload:): only the "
            "'prefix' and 'radix' policies have a host tier"
        )

    def host_breakdown_values(self) -> tuple[int, int]:
        """``(cached, free)`` slots of the host tier: they sum to its size. ``(0, 0)`` without one."""
        tier = self.host_tier
        if tier is None:
            return 0, 0
        return tier.host_slots(self.pool.block_size)

    # -- shared argument checks --------------------------------------------------------------------
    def _check_new_sequence(self, seq_id: int, prompt: TokenContent, final_len: int) -> int:
        if self._has_sequence(seq_id):
            raise PolicyInputError(f"sequence {seq_id} is already allocated")
        validate_content(prompt, f"prompt of sequence {seq_id}", PolicyInputError)
        prompt_len = content_length(prompt)
        if prompt_len <= 0:
            raise PolicyInputError(f"sequence {seq_id}: prompt is empty")
        if final_len < prompt_len:
            raise PolicyInputError(
                f"sequence {seq_id}: final_len={final_len} is below the prompt length {prompt_len}"
            )
        if final_len > self.pool.max_model_len + self.lookahead_slots:
            raise PolicyInputError(
                f"sequence {seq_id}: final_len={final_len} exceeds max_model_len={self.pool.max_model_len}"
                + (f" + {self.lookahead_slots} lookahead slots" if self.lookahead_slots else "")
            )
        return prompt_len

    def _check_growth(self, seq_id: int, num_tokens: int, current_len: int, final_len: int) -> None:
        if num_tokens <= 0:
            raise PolicyInputError(f"sequence {seq_id}: cannot grow by {num_tokens} tokens")
        if current_len + num_tokens > final_len:
            raise PolicyInputError(
                f"sequence {seq_id}: growing {current_len} by {num_tokens} tokens passes its final length {final_len}"
            )

    def _check_children(self, parent_id: int, parent_len: int, children: Sequence[ChildSpec]) -> None:
        seen: set[int] = set()
        for child in children:
            if self._has_sequence(child.seq_id) or child.seq_id in seen:
                raise PolicyInputError(f"fork of {parent_id}: child id {child.seq_id} is already in use")
            if child.final_len < parent_len or child.final_len > self.pool.max_model_len:
                raise PolicyInputError(
                    f"fork of {parent_id}: child {child.seq_id} final_len={child.final_len} must be between "
                    f"the parent's length {parent_len} and max_model_len={self.pool.max_model_len}"
                )
            seen.add(child.seq_id)

    @abstractmethod
    def _has_sequence(self, seq_id: int) -> bool: ...

    def _allocation_failure(
        self, message: str, needed_slots: int, free_slots: int, prefix_hit: PrefixHit = NO_HIT
    ) -> OutOfKVMemory:
        """Count a failed allocation and describe it; the caller raises it (nothing has changed yet)."""
        self.stats.allocation_failures += 1
        return OutOfKVMemory(message, needed_slots=needed_slots, free_slots=free_slots, prefix_hit=prefix_hit)


class SequenceLengths(Protocol):
    @property
    def num_tokens(self) -> int: ...

    @property
    def final_len(self) -> int: ...


SequenceT = TypeVar("SequenceT", bound=SequenceLengths)


def unknown_sequence(seq_id: int) -> PolicyInputError:
    """The error for an operation on a sequence the pool does not hold."""
    return PolicyInputError(f"unknown sequence id {seq_id!r} (never admitted, or already freed)")


def grow_each_arguments_error(seq_ids: Sequence[int], num_tokens: Sequence[int]) -> PolicyInputError:
    """The error for a ``grow_each`` whose ids repeat or whose token counts do not pair with them."""
    return PolicyInputError(
        f"grow_each needs distinct sequence ids, one token count each: {list(seq_ids)}, {list(num_tokens)}"
    )


@mypyc_attr(allow_interpreted_subclasses=True)
class SequenceTable(KVCachePolicy, Generic[SequenceT]):
    """A policy that keeps its live sequences in ``self.sequences`` by id: the per-sequence queries.
    (A base class, not a mixin: a compiled build allows single inheritance only.)"""

    sequences: dict[int, SequenceT]

    def _has_sequence(self, seq_id: int) -> bool:
        return seq_id in self.sequences

    def _get(self, seq_id: int) -> SequenceT:
        try:
            return self.sequences[seq_id]
        except KeyError:
            raise unknown_sequence(seq_id) from None

    def seq_len(self, seq_id: int) -> int:
        return self._get(seq_id).num_tokens

    def final_len(self, seq_id: int) -> int:
        return self._get(seq_id).final_len

    def live_sequences(self) -> Iterable[int]:
        return self.sequences.keys()


# --------------------------------------------------------------------------------------------------
# Registry: YAML names -> classes
# --------------------------------------------------------------------------------------------------

_REGISTRY: dict[str, type[KVCachePolicy]] = {}


# The methods every policy implements (its @abstractmethod ones; tests/test_policy_registry.py keeps the
# list in step with the decorators).
ABSTRACT_METHODS = (
    "_has_sequence",
    "admit",
    "available_slots",
    "breakdown_values",
    "can_admit",
    "final_len",
    "fork",
    "free",
    "grow",
    "growth_room",
    "live_sequences",
    "seq_len",
    "slots_needed_to_grow",
)


def register(name: str, cls: type[KVCachePolicy]) -> None:
    """Make ``cls`` the policy that configs name ``name``. (A call after the class, not a class
    decorator: a decorated class could not be compiled into a native class.)"""
    if name in _REGISTRY:
        raise ValueError(f"policy name {name!r} registered twice")
    missing = [
        method for method in ABSTRACT_METHODS if getattr(cls, method) is getattr(KVCachePolicy, method)
    ]
    if missing:
        raise TypeError(f"policy {cls.__name__} ({name!r}) does not implement {', '.join(missing)}")
    cls.name = name
    _REGISTRY[name] = cls


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[KVCachePolicy]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PolicyInputError(
            f"unknown policy {name!r}; known policies: {', '.join(policy_names())}"
        ) from None


def make_policy(name: str, pool: PoolSpec, **options: object) -> KVCachePolicy:
    """Build the policy registered as ``name``; ``options`` are its own keyword arguments."""
    return policy_class(name)(pool, **options)
