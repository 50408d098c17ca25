"""Trace-derived workloads: Azure 2023, Mooncake, length tables, and any CSV / JSONL file.

Every source becomes the same stream of rows (arrival, prompt and output lengths, optional block hash
ids and session), read lazily line by line: memory stays bounded by what the engine has not consumed
(except with ``on_unsorted: sort``, ``length_table`` orders ``shuffle``/``sample`` and
``session_mode: extend``, which must hold rows or sessions, as their docs say).

The transformations run in this order: parse (bad rows: fail or skip and count) → order check (fail, or
sort) → time window → max_model_len (cap or drop, counted) → sampling → num_requests → shift to t=0 →
tie spreading → rate scaling. Nothing is dropped without a count in :meth:`TraceWorkload.describe`.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import difflib
import hashlib
import itertools
import json
import math
import re
import warnings
from collections.abc import Callable, Generator, Hashable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

import numpy as np

from token_content import TokenContent, content_length
from workloads.arrivals import arrival_times
from workloads.base import Remedy, SkippedRowsWarning, TraceError, TraceWarning, Workload, resolve_path
from workloads.config import (
    AzureSource,
    CsvSource,
    JsonlSource,
    LengthTableSource,
    MooncakeSource,
    TraceWorkloadConfig,
)
from workloads.content import OUTPUT_SLOT, PROMPT_SLOT, ContentIds, hash_prompt
from workloads.distributions import Draws, Sampler
from workloads.request import Request
from workloads.samples import lognormal_spread, with_sample_lengths

_PER_S = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_TAG_SAMPLE, _TAG_ARRIVALS, _TAG_SHUFFLE, _TAG_SPREAD, _TAG_N, _TAG_BEAM = 21, 22, 23, 24, 25, 26
_HASH_SPLIT = re.compile(r"[,;\s]+")
_SHA_LIMIT_BYTES = 512 << 20


# --------------------------------------------------------------------------------------------------
# Rows and field mappings
# --------------------------------------------------------------------------------------------------


@dataclass(slots=True, init=False)
class TraceRow:
    """One request as read from a file. ``arrival_s`` is in seconds (datetime columns: after the
    file's first row); ``nan`` when the source has no arrival times. ``line`` is 1-based. (Its
    constructor is written out: compiled, it runs natively, once per row.)"""

    line: int
    arrival_s: float
    prompt_len: int
    output_len: int
    hash_ids: list[Hashable] | None
    session: Hashable | None

    def __init__(
        self,
        line: int,
        arrival_s: float,
        prompt_len: int,
        output_len: int,
        hash_ids: list[Hashable] | None = None,
        session: Hashable | None = None,
    ) -> None:
        self.line = line
        self.arrival_s = arrival_s
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.hash_ids = hash_ids
        self.session = session


@dataclass(frozen=True)
class FieldMap:
    """Where a file keeps each quantity (CSV column or JSON field names)."""

    fmt: Literal["csv", "jsonl"]
    prompt_len: str
    output_len: str
    arrival: str | None = None
    arrival_unit: str = "s"
    datetime_format: str | None = None
    hash_ids: str | None = None
    hash_block_len: int | None = None
    session: str | None = None
    delimiter: str = ","
    on_hash_length_mismatch: str = "error"

    @property
    def names(self) -> list[str]:
        return [
            name
            for name in (self.arrival, self.prompt_len, self.output_len, self.hash_ids, self.session)
            if name
        ]


AZURE_FIELDS = FieldMap(
    fmt="csv",
    arrival="TIMESTAMP",
    arrival_unit="datetime",
    prompt_len="ContextTokens",
    output_len="GeneratedTokens",
)


def field_map(source: Any) -> FieldMap:
    """The :class:`FieldMap` of a configured source."""
    if isinstance(source, AzureSource):
        return AZURE_FIELDS
    if isinstance(source, MooncakeSource):
        return FieldMap(
            fmt="jsonl",
            arrival="timestamp",
            arrival_unit="ms",
            prompt_len="input_length",
            output_len="output_length",
            hash_ids="hash_ids",
            hash_block_len=source.hash_block_len,
            on_hash_length_mismatch=source.on_hash_length_mismatch,
        )
    if isinstance(source, LengthTableSource):
        return FieldMap(fmt="csv", prompt_len=source.prompt_len_column, output_len=source.output_len_column)
    if isinstance(source, CsvSource):
        return FieldMap(
            fmt="csv",
            arrival=source.arrival_column,
            arrival_unit=source.arrival_unit,
            datetime_format=source.datetime_format,
            prompt_len=source.prompt_len_column,
            output_len=source.output_len_column,
            hash_ids=source.hash_ids_column,
            hash_block_len=source.hash_block_len,
            session=source.session_column,
            delimiter=source.delimiter,
            on_hash_length_mismatch=source.on_hash_length_mismatch,
        )
    if isinstance(source, JsonlSource):
        return FieldMap(
            fmt="jsonl",
            arrival=source.arrival_field,
            arrival_unit=source.arrival_unit,
            datetime_format=source.datetime_format,
            prompt_len=source.prompt_len_field,
            output_len=source.output_len_field,
            hash_ids=source.hash_ids_field,
            hash_block_len=source.hash_block_len,
            session=source.session_field,
            on_hash_length_mismatch=source.on_hash_length_mismatch,
        )
    raise TypeError(f"unknown trace source {source!r}")


# --------------------------------------------------------------------------------------------------
# Counting what happens to rows
# --------------------------------------------------------------------------------------------------


class RowCounts:
    """What happened to the rows of one replay (exposed through ``describe()``)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {
            "rows_read": 0,
            "blank_lines": 0,
            "rows_skipped": 0,
            "hash_length_mismatches": 0,
            "rows_out_of_order": 0,
            "outside_window": 0,
            "capped_output": 0,
            "capped_prompt": 0,
            "dropped_too_long": 0,
            "sampled_out": 0,
            "session_context_mismatches": 0,
            "requests": 0,
        }
        self.skipped: dict[str, int] = {}
        self.skipped_lines: list[int] = []
        self.window_end_line: int | None = None

    def add(self, key: str, amount: int = 1) -> None:
        self.counts[key] += amount

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counts)
        out["skipped_by_reason"] = dict(self.skipped)
        out["first_skipped_lines"] = list(self.skipped_lines)
        if self.window_end_line is not None:
            out["stopped_at_window_end_line"] = self.window_end_line
        return out


class _BadRow(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def _count(value: Any, name: str) -> int:
    """A token count from a CSV cell or JSON value: a positive integer (``12`` or ``12.0``)."""
    if value.__class__ is str or value.__class__ is int:
        # The common case, once per field of every row: int() accepts exactly what the general path
        # would after its strip(); anything else ("12.0", "", "x") takes the general path.
        try:
            number = int(value)
        except ValueError:
            pass
        else:
            if number > 0:
                return number
    if isinstance(value, bool) or value is None:
        raise _BadRow("non_numeric", f"{name} is {value!r}, not a number")
    if isinstance(value, int):
        number = value
    else:
        text = value.strip() if isinstance(value, str) else value
        if isinstance(text, str) and text == "":
            raise _BadRow("missing_value", f"{name} is empty")
        try:
            number = int(text)
        except (TypeError, ValueError):
            try:
                as_float = float(text)
            except (TypeError, ValueError):
                raise _BadRow("non_numeric", f"{name} is {value!r}, not a number") from None
            if not math.isfinite(as_float) or as_float != int(as_float):
                raise _BadRow("non_numeric", f"{name} is {value!r}, not a whole number") from None
            number = int(as_float)
    if number < 0:
        raise _BadRow("negative", f"{name} is negative ({number})")
    if number == 0:
        raise _BadRow("zero", f"{name} is 0 (a request needs at least one token)")
    return number


def _hash_list(value: Any, name: str) -> list[Hashable]:
    if isinstance(value, list):
        if all(type(item) is int for item in value):
            return value  # a JSON list of integers (nearly every row)
        items = value
    elif isinstance(value, str):
        text = value.strip().strip("[]()").strip()
        items = [item for item in _HASH_SPLIT.split(text) if item] if text else []
    else:
        raise _BadRow("bad_hash_ids", f"{name} is {value!r}, not a list of hash ids")
    out: list[Hashable] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise _BadRow("bad_hash_ids", f"{name} holds {item!r}, not an int or string hash id")
        if isinstance(item, str):
            item = item.strip().strip("'\"")
            try:
                out.append(int(item))
            except ValueError:
                out.append(item)
        else:
            out.append(item)
    return out


class _ArrivalParser:
    """Arrival values -> seconds. Datetimes count from the first one parsed (the file's first row)."""

    def __init__(self, fields: FieldMap):
        self.unit = fields.arrival_unit
        self.name = fields.arrival or ""
        self.format = fields.datetime_format
        self.origin: datetime | None = None

    def __call__(self, value: Any) -> float:
        if self.unit != "datetime":
            if isinstance(value, bool) or value is None:
                raise _BadRow("non_numeric", f"{self.name} is {value!r}, not a number")
            try:
                number = float(value.strip() if isinstance(value, str) else value)
            except (TypeError, ValueError):
                raise _BadRow("non_numeric", f"{self.name} is {value!r}, not a number") from None
            if not math.isfinite(number):
                raise _BadRow("non_numeric", f"{self.name} is {value!r}, not a finite number")
            divisor = _PER_S[self.unit]
            return number / divisor if divisor != 1 else number
        if not isinstance(value, str):
            raise _BadRow("bad_timestamp", f"{self.name} is {value!r}, not a date-time string")
        text = value.strip()
        try:
            moment = datetime.strptime(text, self.format) if self.format else datetime.fromisoformat(text)
        except ValueError:
            expected = f"format {self.format!r}" if self.format else "ISO 8601"
            raise _BadRow(
                "bad_timestamp", f"{self.name} is {value!r}, not a date-time ({expected})"
            ) from None
        if moment.tzinfo is not None:
            moment = moment.astimezone(UTC).replace(tzinfo=None)
        if self.origin is None:
            self.origin = moment
        return (moment - self.origin).total_seconds()


# --------------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------------


class TraceReader:
    """Reads a trace file row by row into :class:`TraceRow` objects, validating each."""

    def __init__(self, path: Path, fields: FieldMap, counts: RowCounts, on_bad_row: str = "error"):
        self.path = path
        self.fields = fields
        self.counts = counts
        self.on_bad_row = on_bad_row
        self.arrivals = _ArrivalParser(fields)
        self._warned: set[str] = set()

    # -- shared ------------------------------------------------------------------------------------
    def _bad(self, error: _BadRow, line: int) -> None:
        if self.on_bad_row == "error":
            raise TraceError(error.message, self.path, line, Remedy("on_bad_row", "skip", "skip such rows"))
        counts = self.counts
        counts.add("rows_skipped")
        counts.skipped[error.reason] = counts.skipped.get(error.reason, 0) + 1
        if len(counts.skipped_lines) < 20:
            counts.skipped_lines.append(line)
        if error.reason not in self._warned:
            self._warned.add(error.reason)
            warnings.warn(SkippedRowsWarning(self.path, line, error.message), stacklevel=3)

    def _picker(self, key: Callable[[str], Any]) -> Callable[[Any], tuple]:
        """One C call that takes a row's raw fields (CSV cells or a JSON object) in the order
        :meth:`_row` reads them: prompt, output, then arrival, hash ids and session where the file
        has them. ``key``: a field name -> its index in the row (or the name itself)."""
        fields = self.fields
        optional = (fields.arrival, fields.hash_ids, fields.session)
        names = [fields.prompt_len, fields.output_len, *(name for name in optional if name)]
        return itemgetter(*(key(name) for name in names))

    def _row(self, line: int, values: tuple) -> TraceRow:
        fields = self.fields
        prompt_len = _count(values[0], fields.prompt_len)
        output_len = _count(values[1], fields.output_len)
        next_value = 2
        arrival_s = math.nan
        if fields.arrival:
            arrival_s = self.arrivals(values[next_value])
            next_value += 1
        hash_ids = None
        if fields.hash_ids:
            hash_ids = _hash_list(values[next_value], fields.hash_ids)
            next_value += 1
            self._check_hashes(hash_ids, prompt_len, line)
        session = None
        if fields.session:
            raw = values[next_value]
            if isinstance(raw, str):
                raw = raw.strip()
            if isinstance(raw, list | dict):
                raise _BadRow("bad_session", f"{fields.session} is {raw!r}, not a session id")
            session = None if raw in ("", None) else raw
        return TraceRow(line, arrival_s, prompt_len, output_len, hash_ids, session)

    def _check_hashes(self, hash_ids: list[Hashable], prompt_len: int, line: int) -> None:
        block = self.fields.hash_block_len
        assert block is not None
        blocks = len(hash_ids)
        if block * (blocks - 1) < prompt_len <= block * blocks:
            return
        message = (
            f"{self.fields.prompt_len}={prompt_len} does not match {blocks} hash ids of {block} tokens "
            f"(expected {block * (blocks - 1) + 1}..{block * blocks} tokens)"
        )
        if self.fields.on_hash_length_mismatch == "error":
            raise TraceError(message, self.path, line, Remedy("on_hash_length_mismatch", "warn", "accept"))
        self.counts.add("hash_length_mismatches")
        if "hash_length" not in self._warned:
            self._warned.add("hash_length")
            warnings.warn(
                f"{self.path}:{line}: {message}; using the first {prompt_len} tokens of the chain "
                "(unique tokens past its end); counted in describe()",
                TraceWarning,
                stacklevel=4,
            )

    def _missing(self, found: list[str], what: str, line: int = 1) -> TraceError:
        missing = [name for name in self.fields.names if name not in found]
        hints = []
        for name in missing:
            close = difflib.get_close_matches(name, found, n=1)
            if close:
                hints.append(f"{name!r} (did you mean {close[0]!r}?)")
            else:
                hints.append(repr(name))
        shown = ", ".join(repr(name) for name in found[:30]) + (" ..." if len(found) > 30 else "")
        return TraceError(f"missing {what}(s) {', '.join(hints)}; {what}s found: {shown}", self.path, line)

    def rows(self) -> Generator[TraceRow, None, None]:
        return self._csv_rows() if self.fields.fmt == "csv" else self._jsonl_rows()

    # -- CSV -----------------------------------------------------------------------------------------
    def _csv_rows(self) -> Generator[TraceRow, None, None]:
        try:
            yield from self._csv_rows_utf8()
        except UnicodeDecodeError as error:
            # The decoder reads in chunks, so the line of the bad byte is not known here.
            raise TraceError(
                f"not UTF-8 text (byte {error.object[error.start]:#04x} cannot be decoded); save the file as UTF-8",
                self.path,
            ) from None

    def _csv_rows_utf8(self) -> Iterator[TraceRow]:
        with open(self.path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle, delimiter=self.fields.delimiter)
            try:
                header = next(reader, None)
                if header is None or not any(cell.strip() for cell in header):
                    raise TraceError("empty file (no header row)", self.path)
                header = [cell.strip() for cell in header]
                position = {name: index for index, name in enumerate(header)}
                if any(name not in position for name in self.fields.names):
                    raise self._missing(header, "column")
                width = len(header)
                pick = self._picker(position.__getitem__)
                data_rows = 0
                for cells in reader:
                    line = reader.line_num
                    # (A non-blank first cell settles it without scanning the row.)
                    if not cells or (not cells[0].strip() and not any(cell.strip() for cell in cells)):
                        self.counts.add("blank_lines")
                        continue
                    data_rows += 1
                    self.counts.add("rows_read")
                    try:
                        if len(cells) != width:
                            raise _BadRow("field_count", f"expected {width} fields, found {len(cells)}")
                        yield self._row(line, pick(cells))
                    except _BadRow as error:
                        self._bad(error, line)
            except csv.Error as error:
                raise TraceError(f"unreadable CSV: {error}", self.path, reader.line_num) from None
            except UnicodeDecodeError as error:
                raise TraceError(f"not UTF-8 text: {error}", self.path) from None
        if data_rows == 0:
            raise TraceError("no data rows (only a header)", self.path)

    # -- JSON Lines ----------------------------------------------------------------------------------
    def _jsonl_rows(self) -> Generator[TraceRow, None, None]:
        checked = False
        data_rows = 0
        pick = self._picker(lambda name: name)
        with open(self.path, "rb") as handle:
            for line, raw in enumerate(handle, start=1):
                if not raw.strip():
                    self.counts.add("blank_lines")
                    continue
                data_rows += 1
                self.counts.add("rows_read")
                try:
                    try:
                        record = json.loads(raw)
                    except (json.JSONDecodeError, UnicodeDecodeError) as error:
                        detail = error.msg if isinstance(error, json.JSONDecodeError) else str(error)
                        tail = "" if raw.endswith(b"\n") else " (last line, no newline: truncated file?)"
                        raise _BadRow("invalid_json", f"invalid or truncated JSON: {detail}{tail}") from None
                    if not isinstance(record, dict):
                        raise _BadRow(
                            "invalid_json", f"expected a JSON object, found {type(record).__name__}"
                        )
                    missing = [name for name in self.fields.names if name not in record]
                    if missing:
                        if not checked:
                            raise self._missing(list(record), "field", line)
                        raise _BadRow("missing_field", f"missing field(s) {', '.join(map(repr, missing))}")
                    checked = True
                    yield self._row(line, pick(record))
                except _BadRow as error:
                    self._bad(error, line)
        if data_rows == 0:
            raise TraceError("empty file (no JSON lines)", self.path)


# --------------------------------------------------------------------------------------------------
# Transformations (generators over rows)
# --------------------------------------------------------------------------------------------------


def _not_before_zero(rows: Iterable[TraceRow], path: Path) -> Iterator[TraceRow]:
    """Rows kept at their own times must not arrive before the simulation starts (t = 0): a request
    would count its wait from before it (the first row is the earliest: the rows are in order)."""
    for row in rows:
        if row.arrival_s < 0:
            raise TraceError(
                f"arrival time {row.arrival_s:g} s is before the simulation starts (t = 0) and "
                "shift_to_zero is false",
                path,
                row.line,
                Remedy("shift_to_zero", "true", "move the first request to t = 0"),
            )
        yield row


def _in_order(rows: Iterable[TraceRow], path: Path) -> Iterator[TraceRow]:
    previous = -math.inf
    previous_line = 0
    for row in rows:
        if row.arrival_s < previous:
            raise TraceError(
                f"arrival time goes backwards: {row.arrival_s:.6f} s after {previous:.6f} s at line "
                f"{previous_line}",
                path,
                row.line,
                Remedy("on_unsorted", "sort", "sort the trace"),
            )
        previous, previous_line = row.arrival_s, row.line
        yield row


def _sorted(rows: Iterable[TraceRow], path: Path, counts: RowCounts) -> Iterator[TraceRow]:
    table = list(rows)
    running = -math.inf
    late = 0
    first_line = None
    for row in table:
        if row.arrival_s < running:
            late += 1
            first_line = first_line or row.line
        else:
            running = row.arrival_s
    if late:
        counts.add("rows_out_of_order", late)
        warnings.warn(
            f"{path}:{first_line}: {late} rows arrive before an earlier row; sorted by arrival time",
            TraceWarning,
            stacklevel=2,
        )
        table.sort(key=lambda row: row.arrival_s)
    return iter(table)


def _spread_ties(
    rows: Iterable[TraceRow], mode: str, width_s: float | None, rng: np.random.Generator
) -> Iterator[TraceRow]:
    """Rows that share an arrival time t are spread over [t, t + width)."""

    def spread(group: list[TraceRow], width: float) -> Iterator[TraceRow]:
        size = len(group)
        if size > 1 and width > 0:
            start = group[0].arrival_s
            if mode == "even":
                offsets = [width * index / size for index in range(size)]
            else:
                offsets = np.sort(rng.uniform(0.0, width, size)).tolist()
            for row, offset in zip(group, offsets, strict=True):
                row.arrival_s = start + offset
        yield from group

    group: list[TraceRow] = []
    last_gap = 0.0
    for row in rows:
        if group and row.arrival_s != group[0].arrival_s:
            gap = row.arrival_s - group[0].arrival_s
            last_gap = gap
            yield from spread(group, width_s if width_s is not None else gap)
            group = []
        group.append(row)
    if group:
        yield from spread(group, width_s if width_s is not None else last_gap)


# --------------------------------------------------------------------------------------------------
# The workload
# --------------------------------------------------------------------------------------------------


_CHECKED_INPUTS: set[tuple[object, ...]] = set()
"""Traces whose requests :meth:`TraceWorkload.check_input` built without an error, by file (path,
size, modification time), settings and seed."""


class TraceWorkload(Workload):
    """Requests replayed from a trace file (see the module docstring for the pipeline)."""

    def __init__(self, config: TraceWorkloadConfig, *, seed: int, base_dir: Path | None = None):
        self.config = config
        self.seed = int(seed)
        self.path = resolve_path(config.source.path, base_dir, "workload.source.path")
        self.fields = field_map(config.source)
        self.block_len = self.fields.hash_block_len
        self._n = Sampler(config.n, what="n", integer=True, floor=1, base_dir=base_dir)
        self._beam = Sampler(config.beam_width, what="beam_width", integer=True, floor=1, base_dir=base_dir)
        self.counts = RowCounts()
        self.time_scale_applied: float | None = config.time_scale
        self._trace_origin: datetime | None = None
        self._sha256: str | None = None
        self._probe()

    def _rng(self, tag: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, tag])

    def _probe(self) -> None:
        """Fail at build time on an empty file or missing columns, not in the middle of a run."""
        reader = TraceReader(self.path, self.fields, RowCounts(), on_bad_row="skip")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            # Closed here, not left to the collector: a compiled generator that is collected
            # suspended does not always close its file (a ResourceWarning in the compiled suite).
            try:
                with contextlib.closing(reader.rows()) as first:
                    next(first, None)
            except TraceError as error:
                structural = error.line is None or error.reason.startswith("missing ")
                if structural:
                    raise

    # -- pipeline --------------------------------------------------------------------------------------
    def _rows(self, counts: RowCounts) -> Iterator[TraceRow]:
        """Rows after parsing, order check, window, length limits, sampling and num_requests."""
        cfg = self.config
        reader = TraceReader(self.path, self.fields, counts, cfg.on_bad_row)
        raw = reader.rows()
        rows: Iterator[TraceRow] = raw
        source = cfg.source
        has_times = self.fields.arrival is not None
        if isinstance(source, LengthTableSource) and source.order != "sequential":
            table = list(rows)
            if source.order == "shuffle":
                rng = self._rng(_TAG_SHUFFLE)
                rows = (table[index] for index in rng.permutation(len(table)))
            else:
                rows = self._sample_rows(table)
        elif has_times:
            rows = (
                _sorted(rows, self.path, counts) if cfg.on_unsorted == "sort" else _in_order(rows, self.path)
            )
            if cfg.window is not None:
                rows = self._window(rows, counts)
        rows = self._length_limit(rows, counts)
        if cfg.sample_fraction is not None and cfg.sample_fraction < 1:
            rows = self._sample(rows, counts, cfg.sample_fraction)
        if cfg.num_requests is not None:
            rows = itertools.islice(rows, cfg.num_requests)
        self._reader = reader
        self._raw_rows = raw
        return rows

    def _sample_rows(self, table: list[TraceRow]) -> Iterator[TraceRow]:
        rng = self._rng(_TAG_SHUFFLE)
        while True:
            for index in rng.integers(0, len(table), 4096).tolist():
                row = table[index]
                yield TraceRow(
                    row.line, row.arrival_s, row.prompt_len, row.output_len, row.hash_ids, row.session
                )

    def _window(self, rows: Iterator[TraceRow], counts: RowCounts) -> Iterator[TraceRow]:
        window = self.config.window
        assert window is not None
        origin: float | None = None
        for row in rows:
            if origin is None:
                origin = row.arrival_s
            offset = row.arrival_s - origin
            if window.end_s is not None and offset >= window.end_s:
                counts.add("outside_window")
                counts.window_end_line = row.line
                return
            if offset < window.start_s:
                counts.add("outside_window")
                continue
            yield row

    def _length_limit(self, rows: Iterator[TraceRow], counts: RowCounts) -> Iterator[TraceRow]:
        limit = self.config.max_model_len
        mode = self.config.on_too_long
        if limit is None or mode == "keep":
            yield from rows
            return
        for row in rows:
            if row.prompt_len + row.output_len > limit:
                if mode == "drop":
                    counts.add("dropped_too_long")
                    continue
                if row.prompt_len < limit:
                    row.output_len = limit - row.prompt_len
                    counts.add("capped_output")
                else:
                    row.prompt_len, row.output_len = limit - 1, 1
                    counts.add("capped_prompt")
            yield row

    def _sample(self, rows: Iterator[TraceRow], counts: RowCounts, fraction: float) -> Iterator[TraceRow]:
        rng = self._rng(_TAG_SAMPLE)
        draws: list[float] = []
        for row in rows:
            if not draws:
                draws = rng.random(4096).tolist()[::-1]
            if draws.pop() < fraction:
                yield row
            else:
                counts.add("sampled_out")

    def _timed(self, counts: RowCounts, scale: float | None) -> Iterator[TraceRow]:
        """Rows with their final arrival times."""
        cfg = self.config
        rows = self._rows(counts)
        if cfg.arrival is not None:
            times = arrival_times(cfg.arrival, self._rng(_TAG_ARRIVALS))
            for row, arrival_s in zip(rows, times, strict=False):
                row.arrival_s = arrival_s
                yield row
            return
        rows = self._shift(rows) if cfg.shift_to_zero else _not_before_zero(rows, self.path)
        if cfg.spread_ties is not None:
            rows = _spread_ties(rows, cfg.spread_ties.mode, cfg.spread_ties.width_s, self._rng(_TAG_SPREAD))
        if scale is None or scale == 1.0:
            yield from rows
            return
        for row in rows:
            row.arrival_s *= scale
            yield row

    @staticmethod
    def _shift(rows: Iterator[TraceRow]) -> Iterator[TraceRow]:
        first: float | None = None
        for row in rows:
            if first is None:
                first = row.arrival_s
            row.arrival_s -= first
            yield row

    def _scale(self) -> float | None:
        cfg = self.config
        if cfg.target_rate_per_s is None:
            return cfg.time_scale
        count, first, last = 0, math.nan, math.nan
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            for row in self._timed(RowCounts(), None):
                if count == 0:
                    first = row.arrival_s
                last = row.arrival_s
                count += 1
        if count < 2 or not last > first:
            raise TraceError(
                f"cannot scale to target_rate_per_s={cfg.target_rate_per_s}: {count} requests over "
                f"{0.0 if count < 2 else last - first:g} s",
                self.path,
            )
        observed = (count - 1) / (last - first)
        return observed / cfg.target_rate_per_s

    # -- requests --------------------------------------------------------------------------------------
    def records(self) -> Generator[tuple[Request, TraceRow], None, None]:
        """Each request with the row it came from (line number, hash ids...)."""
        self.counts = counts = RowCounts()
        self.ids = ids = ContentIds()
        scale = self._scale()
        self.time_scale_applied = scale
        n_draws = Draws(self._n, self._rng(_TAG_N))
        beam_draws = Draws(self._beam, self._rng(_TAG_BEAM))
        sessions: dict[Hashable, int] = {}
        contexts: dict[int, Request] = {}
        extend = self.config.session_mode == "extend"
        block_len = self.block_len
        request_id = 0
        for row in self._timed(counts, scale):
            if request_id == 0:
                self._trace_origin = self._reader.arrivals.origin
            prompt_id = ContentIds.for_request(request_id, PROMPT_SLOT)
            session_id = None
            if row.session is not None:
                session_id = sessions.setdefault(row.session, len(sessions))
            prompt: TokenContent
            if row.hash_ids is not None:
                assert block_len is not None
                prompt = hash_prompt(row.hash_ids, row.prompt_len, block_len, ids, tail_id=prompt_id)
            else:
                prompt = ((prompt_id, row.prompt_len),)
                if extend and session_id is not None:
                    previous = contexts.get(session_id)
                    if previous is not None:
                        base = (*previous.prompt, (previous.output_content_id, previous.output_len))
                        extra = row.prompt_len - content_length(base)
                        if extra >= 0:
                            prompt = (*base, (prompt_id, extra)) if extra else base
                        else:
                            counts.add("session_context_mismatches")
            request = Request(
                request_id=request_id,
                arrival_s=row.arrival_s,
                prompt=prompt,
                output_len=row.output_len,
                output_content_id=ContentIds.for_request(request_id, OUTPUT_SLOT),
                n=n_draws.next_int(),
                beam_width=beam_draws.next_int(),
                session_id=session_id,
            )
            request = self._with_sample_lengths(request)
            if extend and session_id is not None:
                contexts[session_id] = request
            counts.add("requests")
            request_id += 1
            yield request, row
        if request_id == 0:
            raise TraceError(f"no requests left to replay ({self._why_empty(counts)})", self.path)

    def _with_sample_lengths(self, request: Request) -> Request:
        """Samples 1..n-1 spread around the traced length (``sample_length_sigma``), within
        ``max_model_len`` when one is set."""
        cfg = self.config
        if request.n <= 1 or cfg.sample_lengths == "identical":
            return request  # (one sample: nothing to spread, and no closure to build for every row)
        cap = (cfg.max_model_len or 1 << 62) - request.prompt_len
        traced = request.output_len

        def other_lengths(rng: np.random.Generator, count: int) -> list[int]:
            return lognormal_spread(traced, cfg.sample_length_sigma, rng, count, max(cap, 1))

        return with_sample_lengths(request, other_lengths, self.seed)

    @staticmethod
    def _why_empty(counts: RowCounts) -> str:
        shown = {key: value for key, value in counts.as_dict().items() if value and key != "requests"}
        return ", ".join(f"{key}={value}" for key, value in shown.items()) or "no rows"

    def check_input(self) -> None:
        """Build every request the run will replay (the rows its window and ``num_requests`` reach),
        so that a malformed row, a hash list that does not fit its prompt or a trace out of order is
        refused with its file and line before the first simulation, not after the requests before
        it were simulated. Once per file, settings and seed in a process (a plan prepares every
        candidate from the same trace). Skipped rows are warned of by the run, not here too."""
        stat = self.path.stat()
        key = (str(self.path.resolve()), stat.st_size, stat.st_mtime_ns, repr(self.config), self.seed)
        if key in _CHECKED_INPUTS:
            return
        stream = self.records()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TraceWarning)
                for _ in stream:
                    pass
        finally:
            stream.close()
            raw = getattr(self, "_raw_rows", None)
            if raw is not None:
                raw.close()  # (a window or num_requests stops reading before the end: close the file)
        _CHECKED_INPUTS.add(key)

    def requests(self) -> Iterator[Request]:
        stream = self._requests()
        limit = self.config.max_concurrency
        if limit is None:
            return stream
        # A closed loop over the trace: the first ``limit`` requests open, each later one is handed
        # out by follow_up when a slot frees, so it is read from the same stream, in trace order.
        self._held_back = stream
        return itertools.islice(stream, limit)

    def _requests(self) -> Iterator[Request]:
        # A generator function, not a generator expression: compiled, a returned generator
        # expression becomes a list (the whole trace read up front, outside the engine's run).
        for request, _ in self.records():
            yield request

    @property
    def arrivals_known_up_front(self) -> bool:
        return self.config.max_concurrency is None

    def follow_up(self, finished: Request, finish_s: float) -> Request | None:
        """With ``max_concurrency``: the trace's next request, sent when the slot ``finished`` held
        frees, or at its own arrival time if that is later."""
        stream = getattr(self, "_held_back", None)
        if stream is None:
            return None
        following = next(stream, None)
        if following is None:
            return None
        if following.arrival_s >= finish_s:
            return following
        return dataclasses.replace(following, arrival_s=finish_s)

    # -- summary ---------------------------------------------------------------------------------------
    @property
    def trace_origin(self) -> datetime | None:
        """The wall-clock time of the file's first row (datetime arrival columns), once replayed."""
        return self._trace_origin

    def sha256(self) -> str | None:
        if self._sha256 is None and self.path.stat().st_size <= _SHA_LIMIT_BYTES:
            digest = hashlib.sha256()
            with open(self.path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            self._sha256 = digest.hexdigest()
        return self._sha256

    def describe(self) -> dict[str, Any]:
        cfg = self.config
        info: dict[str, Any] = {
            "kind": "trace",
            "num_requests": cfg.num_requests,
            "source": cfg.source.kind,
            "path": cfg.source.path,
            "file": str(self.path),
            "bytes": self.path.stat().st_size,
            "sha256": self.sha256(),
            "seed": self.seed,
            "config": cfg.model_dump(mode="json", exclude_none=True),
            "time_scale_applied": self.time_scale_applied,
            "counts": self.counts.as_dict(),
        }
        if self.block_len is not None:
            info["hash_block_len"] = self.block_len
        if self._trace_origin is not None:
            info["trace_origin"] = self._trace_origin.isoformat()
        return info
