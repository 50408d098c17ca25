"""Workload configuration: the ``workload:`` section of an experiment YAML (pydantic v2).

Two shapes, told apart by the presence of ``source``:

* a **synthetic** workload (:class:`SyntheticWorkloadConfig`): an arrival process, length
  distributions, optional shared system prompts, few-shot templates and multi-turn conversations;
* a **trace** workload (:class:`TraceWorkloadConfig`): requests read from a file (``source:``) with
  optional transformations (time window, rate scaling, sampling, length capping...).

Lengths are in tokens (``*_len``, vLLM's vocabulary: ``prompt_len``, ``output_len``,
``max_model_len``); times in seconds (``*_s``); rates per second (``*_per_s``). Every length or time
that can vary accepts either a plain number (a constant) or a distribution ``{kind: ..., ...}``.

Relative file paths are looked up in the directory of the YAML file first, then in the project root
(so ``traces/...`` always names the project's copy of the public traces).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    Tag,
    TypeAdapter,
    field_validator,
    model_validator,
)

from workloads.config_base import ConfigModel

FILE_FIELD = "x-kvsim-file"
"""Marks a config field that may name a file read relative to the config's folder (then the
project root): ``Field(json_schema_extra={FILE_FIELD: []})``, or with the suffixes a value needs to
be taken as a path (``[".json"]``: otherwise it is a name, e.g. a model preset). Whoever copies a
config to another folder (a sweep's points) finds its paths by this mark."""

# --------------------------------------------------------------------------------------------------
# Distributions
# --------------------------------------------------------------------------------------------------


SampleLengths = Literal["independent", "identical"]


MOST_DISTINCT = 1_000_000
"""The most distinct things of one kind a synthetic workload draws from (system prompts, templates,
examples, users): each is built up front, so a count past it is a slip, not a workload."""


class _Model(ConfigModel):
    # (No infinite or NaN numbers: a lognormal of sigma .inf, given by its mean, drew NaN lengths.)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Clipped(_Model):
    min: float | None = Field(None, description="Clip samples below this value (lengths: default 1).")
    max: float | None = Field(None, description="Clip samples above this value.")

    @model_validator(mode="after")
    def _check_bounds(self) -> _Clipped:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min={self.min} is above max={self.max}")
        return self


class ConstantDist(_Model):
    """Always ``value``. A plain number is shorthand for this."""

    kind: Literal["constant"]
    value: float = Field(description="The value every sample takes.")


class UniformDist(_Model):
    """Uniform on ``[low, high]`` (both ends included for integer quantities such as lengths)."""

    kind: Literal["uniform"]
    low: float = Field(description="Smallest value.")
    high: float = Field(description="Largest value.")

    @model_validator(mode="after")
    def _check(self) -> UniformDist:
        if self.low > self.high:
            raise ValueError(f"low={self.low} is above high={self.high}")
        return self


class NormalDist(_Clipped):
    """Normal with ``mean`` and ``std``, clipped to ``[min, max]`` (lengths are rounded)."""

    kind: Literal["normal"]
    mean: float = Field(description="Mean before clipping.")
    std: NonNegativeFloat = Field(description="Standard deviation before clipping.")


class LognormalDist(_Clipped):
    """Log-normal: ``exp(N(mu, sigma))``, given by its ``mean`` or its ``median`` (exactly one) and
    ``sigma``, the standard deviation of the log. Clipped to ``[min, max]`` (lengths are rounded)."""

    kind: Literal["lognormal"]
    mean: PositiveFloat | None = Field(None, description="Mean of the distribution (not of its log).")
    median: PositiveFloat | None = Field(None, description="Median = exp(mu).")
    sigma: NonNegativeFloat = Field(description="Standard deviation of the log (shape).")

    @model_validator(mode="after")
    def _check(self) -> LognormalDist:
        if (self.mean is None) == (self.median is None):
            raise ValueError("lognormal: give exactly one of `mean` or `median`")
        return self


class ExponentialDist(_Clipped):
    """Exponential with ``mean`` (think times), clipped to ``[min, max]``."""

    kind: Literal["exponential"]
    mean: NonNegativeFloat = Field(description="Mean.")


class TableDist(_Model):
    """A value drawn uniformly (with replacement) from a numeric column of a CSV file, e.g. the
    ``num_decode_tokens`` column of a length table under ``traces/``."""

    kind: Literal["table"]
    path: str = Field(
        description="CSV file (relative: to the YAML's folder, then the project root).",
        json_schema_extra={FILE_FIELD: []},
    )
    column: str = Field(description="Column to sample.")


class ChoiceDist(_Model):
    """One of ``values``, with probabilities proportional to ``weights`` (default: equal)."""

    kind: Literal["choice"]
    values: list[float] = Field(min_length=1, description="Possible values.")
    weights: list[NonNegativeFloat] | None = Field(None, description="Relative weights, one per value.")

    @model_validator(mode="after")
    def _check(self) -> ChoiceDist:
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise ValueError(f"{len(self.weights)} weights for {len(self.values)} values")
            if sum(self.weights) <= 0:
                raise ValueError("weights must not all be zero")
        return self


Dist = Annotated[
    ConstantDist | UniformDist | NormalDist | LognormalDist | ExponentialDist | TableDist | ChoiceDist,
    Field(discriminator="kind"),
]
"""A distribution of values (see the ``*Dist`` classes); ``kind`` selects it."""

LengthSpec = int | Dist
"""A token count: a plain int (constant) or a distribution; samples are rounded to ints."""

TimeSpec = float | Dist
"""A duration in seconds: a plain number (constant) or a distribution."""

# --------------------------------------------------------------------------------------------------
# Arrivals
# --------------------------------------------------------------------------------------------------


class PoissonArrival(_Model):
    """Poisson process: exponential inter-arrival gaps (CV 1). The first request arrives at t=0."""

    kind: Literal["poisson"]
    rate_per_s: PositiveFloat = Field(description="Mean arrival rate (vLLM benchmark: request_rate).")


class GammaArrival(_Model):
    """Gamma-distributed gaps: a renewal process with mean rate ``rate_per_s`` and burstiness given
    either as ``cv`` (std/mean of the gaps; 1 = Poisson, > 1 bursty, < 1 regular) or as vLLM's
    ``burstiness`` (the gamma shape, = 1/cv²). The first request arrives at t=0."""

    kind: Literal["gamma"]
    rate_per_s: PositiveFloat = Field(description="Mean arrival rate.")
    cv: PositiveFloat | None = Field(None, description="Coefficient of variation of the gaps.")
    burstiness: PositiveFloat | None = Field(None, description="vLLM's burstiness factor: shape = 1/cv².")

    @model_validator(mode="after")
    def _check(self) -> GammaArrival:
        if (self.cv is None) == (self.burstiness is None):
            raise ValueError("gamma arrival: give exactly one of `cv` or `burstiness`")
        return self

    @property
    def shape(self) -> float:
        if self.burstiness is not None:
            return self.burstiness
        assert self.cv is not None
        return 1.0 / (self.cv * self.cv)


class ConstantArrival(_Model):
    """One request every ``1 / rate_per_s`` seconds, starting at t=0."""

    kind: Literal["constant"]
    rate_per_s: PositiveFloat = Field(description="Arrival rate.")


class BatchArrival(_Model):
    """Every request arrives at once, at ``at_s`` (an offline batch)."""

    kind: Literal["batch"]
    at_s: NonNegativeFloat = Field(0.0, description="Arrival time of all requests.")


class ClosedLoopArrival(_Model):
    """``num_users`` users, each with one request outstanding: a user's next request reaches the
    engine ``think_time_s + send_delay_s`` after its previous one finishes (the engine calls
    ``Workload.follow_up``).

    User ``u``'s first request reaches the engine at ``ramp_up_s * u / num_users`` plus one
    ``send_delay_s`` draw. Request ``k`` of user ``u`` has request id ``k * num_users + u``,
    and each user draws its overhead from its own seeded stream (the ``k``-th draw for its ``k``-th
    request), so the stream does not depend on the order in which the engine finishes requests.

    ``vllm bench serve --max-concurrency N`` (``request_rate`` inf, the default) is this loop with
    ``num_users: N``, no think time, no ramp-up and a client overhead: it creates every request's
    task at t=0, N of them pass an asyncio semaphore at once and each later one passes when a
    finished request releases its slot (``vllm/benchmarks/serve.py``, ``benchmark`` and
    ``limited_request_func``)."""

    kind: Literal["closed_loop"]
    num_users: PositiveInt = Field(
        le=MOST_DISTINCT, description="Concurrent users (vLLM benchmark: max_concurrency)."
    )
    think_time_s: TimeSpec = Field(0.0, description="Pause between a finish and the user's next request.")
    ramp_up_s: NonNegativeFloat = Field(0.0, description="First requests spread evenly over this time.")
    send_delay_s: TimeSpec = Field(
        0.0,
        description="Time between a user's slot freeing and its next request reaching the engine (the "
        "stream closing, the client's bookkeeping, building and sending the next HTTP request, the API "
        "server parsing and tokenizing it), added to think_time_s; the first requests reach the engine "
        "one draw after their ramp-up time. A distribution (drawn per request, seeded per user) "
        "staggers users that finish together; a constant keeps them together. Default 0: the engine "
        "sees the next request the instant a slot frees. To emulate `vllm bench serve`: "
        "`{kind: uniform, low: 0.001, high: 0.011}`, between BLIS's two fits of vLLM on H100 (1.1 ms "
        "from arrival to queued for Llama-3.1-8B at 512 prompt tokens; 11 ms in its global fit, 9.3 ms "
        "before the engine and 1.8 ms after the last token); the uniform spread between them is an "
        "assumption, no per-request jitter was measured. (Unlike engine.client_overhead_s, which only "
        "adds the time outside the engine to the reported TTFT and E2E, this delays the loop.)",
    )

    @field_validator("send_delay_s")
    @classmethod
    def _not_negative(cls, overhead: float | Dist) -> float | Dist:
        # a distribution's impossible values are refused when it is sampled (naming the key too)
        if isinstance(overhead, int | float) and overhead < 0:
            raise ValueError(f"must be >= 0 (a time in seconds), not {overhead}")
        return overhead


OpenLoopArrival = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | BatchArrival, Field(discriminator="kind")
]
Arrival = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | BatchArrival | ClosedLoopArrival,
    Field(discriminator="kind"),
]

# --------------------------------------------------------------------------------------------------
# Prompt structure
# --------------------------------------------------------------------------------------------------


class SharedPrefixConfig(_Model):
    """``num_prefixes`` system prompts; each request (each conversation, in multi-turn workloads)
    starts with one of them, prefix ``i`` (0-based) chosen with probability ∝ 1/(i+1)^zipf_s."""

    num_prefixes: PositiveInt = Field(le=MOST_DISTINCT, description="Number of distinct system prompts (K).")
    prefix_len: LengthSpec = Field(description="Tokens per system prompt (drawn once per prompt).")
    zipf_s: NonNegativeFloat = Field(1.0, description="Zipf exponent of popularity (0 = uniform).")
    fraction: float = Field(1.0, ge=0, le=1, description="Share of requests that have a system prompt.")


class FewShotConfig(_Model):
    """Few-shot templates: template ``j`` is a common instruction followed by ``num_shots`` examples
    drawn (without replacement, in random order) from a pool of ``example_pool_size`` examples. Templates
    are chosen by Zipf popularity. A template follows the system prompt, if any, and precedes the
    request's own tokens, so a prefix cache sees: instruction (shared by all templates), then examples
    (shared by a template's users, and by templates that start with the same examples)."""

    num_templates: PositiveInt = Field(le=MOST_DISTINCT, description="Number of distinct templates.")
    instruction_len: int = Field(0, ge=0, description="Tokens of the instruction common to all templates.")
    num_shots: PositiveInt = Field(le=MOST_DISTINCT, description="Examples per template.")
    shot_len: LengthSpec = Field(description="Tokens per example (drawn once per example).")
    example_pool_size: PositiveInt | None = Field(
        None, le=MOST_DISTINCT, description="Examples to draw from (default: num_templates * num_shots)."
    )
    zipf_s: NonNegativeFloat = Field(1.0, description="Zipf exponent of template popularity.")
    fraction: float = Field(1.0, ge=0, le=1, description="Share of requests that use a template.")

    @model_validator(mode="after")
    def _check(self) -> FewShotConfig:
        if self.example_pool_size is not None and self.example_pool_size < self.num_shots:
            raise ValueError(
                f"example_pool_size={self.example_pool_size} is below num_shots={self.num_shots}"
            )
        return self


class MultiTurnConfig(_Model):
    """Conversations: turn ``t + 1``'s prompt is turn ``t``'s prompt, then turn ``t``'s output
    stream, then ``user_turn_len`` new tokens, so it extends the previous context exactly.

    The next turn is sent ``think_time_s`` after the previous one finishes (the engine calls
    ``Workload.follow_up``); the arrival process gives the start of each conversation (open loop) or
    the users (closed loop). Everything about a conversation is drawn when it starts."""

    turns: LengthSpec = Field(description="Turns per conversation (>= 1).")
    user_turn_len: LengthSpec = Field(description="New user tokens in each turn after the first.")
    think_time_s: TimeSpec = Field(0.0, description="Pause between a turn's finish and the next turn.")
    max_context_len: PositiveInt | None = Field(
        None, description="End a conversation early when the next turn's prompt + output would pass this."
    )


# --------------------------------------------------------------------------------------------------
# Synthetic workload
# --------------------------------------------------------------------------------------------------


class LengthPairsConfig(_Model):
    """(prompt, output) lengths drawn together from one row of a length table (with replacement), so
    their correlation is kept (drawing ``prompt_len`` and ``output_len`` as two ``table``
    distributions pairs rows at random)."""

    path: str = Field(
        description="CSV file (relative: to the YAML's folder, then the project root).",
        json_schema_extra={FILE_FIELD: []},
    )
    prompt_len_column: str = Field("num_prefill_tokens", description="Prompt tokens column.")
    output_len_column: str = Field("num_decode_tokens", description="Output tokens column.")


class SyntheticWorkloadConfig(_Model):
    """Requests drawn from distributions. A first-turn prompt is
    ``[system prompt] + [few-shot template] + prompt_len unique tokens`` (``prompt_len`` is the
    request's own part, as vLLM's random dataset adds ``prefix_len`` to ``input_len``)."""

    num_requests: PositiveInt | None = Field(None, description="Requests in total (all turns, all users).")
    duration_s: PositiveFloat | None = Field(None, description="No request arrives after this time.")
    arrival: Arrival = Field(description="Arrival process (poisson, gamma, constant, batch, closed_loop).")
    prompt_len: LengthSpec | None = Field(None, description="Tokens of each request's own prompt part.")
    output_len: LengthSpec | None = Field(None, description="Tokens each request generates.")
    length_pairs: LengthPairsConfig | None = Field(
        None, description="Draw prompt_len and output_len together from a row of a length table."
    )
    shared_prefix: SharedPrefixConfig | None = Field(None, description="Shared system prompts.")
    few_shot: FewShotConfig | None = Field(None, description="Few-shot templates.")
    multi_turn: MultiTurnConfig | None = Field(None, description="Multi-turn conversations.")
    n: LengthSpec = Field(1, description="Parallel samples per request (OpenAI/vLLM `n`).")
    beam_width: LengthSpec = Field(1, description="Beam width per request (1 = no beam search).")
    sample_lengths: SampleLengths = Field(
        "independent",
        description="With n > 1: independent (each sample's output length drawn from `output_len`; "
        "sample 0 keeps the request's) or identical (every sample generates the same length).",
    )

    @model_validator(mode="after")
    def _check(self) -> SyntheticWorkloadConfig:
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give `num_requests`, `duration_s` or both: the workload must end")
        if self.length_pairs is None and (self.prompt_len is None or self.output_len is None):
            raise ValueError("give `prompt_len` and `output_len`, or `length_pairs`")
        if self.length_pairs is not None and (self.prompt_len is not None or self.output_len is not None):
            raise ValueError("`length_pairs` sets prompt_len and output_len: give one or the other")
        if isinstance(self.arrival, BatchArrival) and self.num_requests is None:
            raise ValueError("a batch arrival needs `num_requests`")
        if isinstance(self.arrival, ClosedLoopArrival) and self.num_requests is None:
            raise ValueError("a closed-loop workload needs `num_requests`")
        return self


# --------------------------------------------------------------------------------------------------
# Trace sources
# --------------------------------------------------------------------------------------------------

ArrivalUnit = Literal["s", "ms", "us", "ns", "datetime"]
OnMismatch = Literal["error", "warn"]


class _FileSource(_Model):
    path: str = Field(
        description="The trace file (relative: to the YAML's folder, then the project root).",
        json_schema_extra={FILE_FIELD: []},
    )


class AzureSource(_FileSource):
    """Azure LLM inference trace 2023 (CSV: TIMESTAMP, ContextTokens, GeneratedTokens)."""

    kind: Literal["azure"]


class MooncakeSource(_FileSource):
    """Mooncake JSONL (timestamp in ms, input_length, output_length, hash_ids of 512-token blocks)."""

    kind: Literal["mooncake"]
    hash_block_len: PositiveInt = Field(512, description="Tokens per hashed block.")
    on_hash_length_mismatch: OnMismatch = Field(
        "error",
        description="input_length outside (block*(k-1), block*k] for k hash ids: fail, or warn, count "
        "and use the first input_length tokens of the chain (plus unique tokens past its end).",
    )


class LengthTableSource(_FileSource):
    """A request-length table (CSV with prompt and output token columns, no arrival times); arrivals
    come from the workload's ``arrival`` process."""

    kind: Literal["length_table"]
    prompt_len_column: str = Field("num_prefill_tokens", description="Prompt tokens column.")
    output_len_column: str = Field("num_decode_tokens", description="Output tokens column.")
    order: Literal["sequential", "shuffle", "sample"] = Field(
        "sample",
        description="sequential: rows in file order (stops at the end); shuffle: a seeded permutation; "
        "sample: rows drawn with replacement (never runs out).",
    )


class _MappedSource(_FileSource):
    arrival_unit: ArrivalUnit = Field(
        "s", description="Unit of the arrival column: s, ms, us, ns, or datetime (a date-time string)."
    )
    datetime_format: str | None = Field(
        None, description="strftime format of datetime arrivals (default: ISO 8601)."
    )
    hash_block_len: PositiveInt | None = Field(
        None, description="Tokens per hashed block (needed with hashes)."
    )
    on_hash_length_mismatch: OnMismatch = Field("error", description="See the mooncake source.")

    def _check_hashes(self, hash_name: str | None) -> None:
        if hash_name is not None and self.hash_block_len is None:
            raise ValueError("a hash-id column needs `hash_block_len` (tokens per hashed block)")


class CsvSource(_MappedSource):
    """Any CSV with a header row; name its columns here."""

    kind: Literal["csv"]
    arrival_column: str | None = Field(
        None, description="Arrival time column (none: arrivals come from the workload's `arrival`)."
    )
    prompt_len_column: str = Field(description="Prompt tokens column.")
    output_len_column: str = Field(description="Output tokens column.")
    hash_ids_column: str | None = Field(
        None, description="Prefix block hash list column: '[1, 2, 3]' or '1 2 3' or '1;2;3'."
    )
    session_column: str | None = Field(None, description="Session / conversation / user column.")
    delimiter: str = Field(",", min_length=1, max_length=1, description="Field separator.")

    @model_validator(mode="after")
    def _check(self) -> CsvSource:
        self._check_hashes(self.hash_ids_column)
        return self


class JsonlSource(_MappedSource):
    """Any JSON Lines file (one object per line); name its fields here."""

    kind: Literal["jsonl"]
    arrival_field: str | None = Field(
        None, description="Arrival time field (none: arrivals come from the workload's `arrival`)."
    )
    prompt_len_field: str = Field(description="Prompt tokens field.")
    output_len_field: str = Field(description="Output tokens field.")
    hash_ids_field: str | None = Field(None, description="Prefix block hash list field (a JSON list).")
    session_field: str | None = Field(None, description="Session / conversation / user field.")

    @model_validator(mode="after")
    def _check(self) -> JsonlSource:
        self._check_hashes(self.hash_ids_field)
        return self


TraceSource = Annotated[
    AzureSource | MooncakeSource | LengthTableSource | CsvSource | JsonlSource, Field(discriminator="kind")
]


class TimeWindow(_Model):
    """Keep requests with ``start_s <= t < end_s``, t in seconds after the trace's first request."""

    start_s: NonNegativeFloat = Field(0.0, description="Window start.")
    end_s: PositiveFloat | None = Field(None, description="Window end (none: the end of the trace).")

    @model_validator(mode="after")
    def _check(self) -> TimeWindow:
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s={self.end_s} is not after start_s={self.start_s}")
        return self


class SpreadTies(_Model):
    """Spread requests that share a timestamp (quantised traces such as Mooncake's 3 s batches) over
    ``width_s`` (default: the gap to the next distinct timestamp; for the last one, the gap before it)."""

    mode: Literal["even", "uniform"] = Field(
        "even", description="even: equally spaced; uniform: seeded uniform draws, sorted."
    )
    width_s: PositiveFloat | None = Field(None, description="Spread width (default: the next gap).")


class TraceWorkloadConfig(_Model):
    """Requests replayed from a trace file, transformed in this order: parse (bad rows: fail or
    skip) → order check (fail or sort) → time window → max_model_len (cap or drop) → sampling →
    num_requests → time shift to 0 → tie spreading → rate scaling."""

    source: TraceSource = Field(description="The trace file and its format.")
    arrival: OpenLoopArrival | None = Field(
        None,
        description="Synthetic arrivals: required for sources without arrival times (length tables); "
        "for the others it replaces the trace's timestamps.",
    )
    num_requests: PositiveInt | None = Field(None, description="Keep only the first N requests.")
    window: TimeWindow | None = Field(None, description="Time window of the trace to replay.")
    sample_fraction: float | None = Field(
        None, gt=0, le=1, description="Keep each request with this probability (seeded)."
    )
    time_scale: PositiveFloat | None = Field(
        None, description="Multiply arrival times by this factor (0.5 = twice the rate)."
    )
    target_rate_per_s: PositiveFloat | None = Field(
        None,
        description="Scale time so that the mean rate is this (burstiness, i.e. the gaps' CV, is kept).",
    )
    shift_to_zero: bool = Field(True, description="Move the first kept request to t=0.")
    spread_ties: SpreadTies | None = Field(None, description="Spread requests that share a timestamp.")
    max_model_len: PositiveInt | None = Field(
        None, description="Longest prompt + output allowed (see on_too_long)."
    )
    on_too_long: Literal["keep", "cap", "drop"] = Field(
        "cap",
        description="Requests with prompt + output > max_model_len: keep (the engine rejects them), "
        "cap (cut the output, then the prompt's tail; counted) or drop (counted).",
    )
    on_bad_row: Literal["error", "skip"] = Field(
        "error",
        description="Malformed rows: fail with file and line, or skip and count them. Every row the "
        "run will reach (its window, num_requests) is read before the first simulation, and by kvsim "
        "check.",
    )
    on_unsorted: Literal["error", "sort"] = Field(
        "error", description="Timestamps going backwards: fail, or sort (loads the trace in memory; warns)."
    )
    session_mode: Literal["label", "extend"] = Field(
        "label",
        description="With a session column: label (only set session_id) or extend (a session's next "
        "request is its previous prompt + output + new tokens, when its length allows).",
    )
    max_concurrency: PositiveInt | None = Field(
        None,
        description="Replay as `vllm bench serve --max-concurrency N` sends: at most N requests in "
        "flight, in trace order; a request goes when its arrival time has come and a slot is free (the "
        "previous holder finished or was rejected), at max(its arrival, that finish). None: open loop.",
    )
    n: LengthSpec = Field(1, description="Parallel samples per request.")
    beam_width: LengthSpec = Field(1, description="Beam width per request.")
    sample_lengths: SampleLengths = Field(
        "independent",
        description="With n > 1: independent (sample 0 keeps the traced length, the others spread "
        "around it, see sample_length_sigma) or identical (every sample generates the traced length).",
    )
    sample_length_sigma: NonNegativeFloat = Field(
        0.5,
        description="Independent samples of a trace request: each other sample's length is the traced "
        "length times exp(sigma * Z), Z standard normal (a lognormal whose median is the traced length; "
        "0.5: half the samples within about x0.7..x1.4 of it). An assumption, not a measurement.",
    )

    @model_validator(mode="after")
    def _check(self) -> TraceWorkloadConfig:
        if self.time_scale is not None and self.target_rate_per_s is not None:
            raise ValueError("give `time_scale` or `target_rate_per_s`, not both")
        # `drop` without a length would silently drop nothing. The default `cap` given explicitly is
        # accepted: a run folder's config.yaml writes every resolved value, and must run again as is.
        if (
            self.on_too_long == "drop"
            and self.max_model_len is None
            and "on_too_long" in self.model_fields_set
        ):
            raise ValueError("`on_too_long` needs `max_model_len`")
        has_times = _source_has_times(self.source)
        if not has_times and self.arrival is None:
            raise ValueError(f"source {self.source.kind!r} has no arrival times: give an `arrival` process")
        if self.arrival is not None:
            timed = [
                name
                for name in ("window", "time_scale", "target_rate_per_s", "spread_ties")
                if getattr(self, name) is not None
            ]
            if timed:
                raise ValueError(
                    f"{', '.join(timed)} transform trace timestamps; with a synthetic `arrival` set its rate instead"
                )
        sampled = isinstance(self.source, LengthTableSource) and self.source.order == "sample"
        if sampled and self.num_requests is None:
            raise ValueError("length_table with order=sample never runs out: give `num_requests`")
        return self


def _source_has_times(source: Any) -> bool:
    if isinstance(source, AzureSource | MooncakeSource):
        return True
    if isinstance(source, CsvSource):
        return source.arrival_column is not None
    if isinstance(source, JsonlSource):
        return source.arrival_field is not None
    return False


# --------------------------------------------------------------------------------------------------
# The top-level type
# --------------------------------------------------------------------------------------------------


def _workload_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "trace" if "source" in value else "synthetic"
    return "trace" if isinstance(value, TraceWorkloadConfig) else "synthetic"


WorkloadConfig = Annotated[
    Annotated[SyntheticWorkloadConfig, Tag("synthetic")] | Annotated[TraceWorkloadConfig, Tag("trace")],
    Discriminator(_workload_kind),
]
"""The ``workload:`` section: a trace workload when it has ``source``, else a synthetic one."""

AnyWorkloadConfig = SyntheticWorkloadConfig | TraceWorkloadConfig

_ADAPTER: TypeAdapter[AnyWorkloadConfig] = TypeAdapter(WorkloadConfig)


def parse_workload_config(data: Any) -> AnyWorkloadConfig:
    """Validate a ``workload:`` mapping (raises pydantic's ``ValidationError``)."""
    return _ADAPTER.validate_python(data)
