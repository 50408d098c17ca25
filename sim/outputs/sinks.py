"""Where a run's per-request table and time series go while the engine runs.

The engine hands rows over in chunks as they are complete (a request's row when it finishes, the
time series every few thousand samples), so memory holds only the rows not yet handed over:

- :class:`MemorySink` keeps them (tests, notebooks, validation runs that read them right away);
- :class:`FileSink` appends them to ``requests.parquet`` / ``timeseries.parquet`` (or ``.csv``) in a
  folder as row groups, so a run of a million requests never holds its outputs in memory (unless
  asked to keep them too: a plan's probe, bounded in length, is measured right after it ran).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sim.outputs.metrics import RequestRecord, requests_frame


class OutputSink(Protocol):
    def write_requests(self, records: list[RequestRecord]) -> None: ...

    def write_timeseries(self, frame: pd.DataFrame) -> None: ...

    def requests(self, columns: list[str] | None = None) -> pd.DataFrame: ...

    def timeseries(self, max_rows: int | None = None) -> pd.DataFrame: ...

    def close(self) -> None: ...


class MemorySink:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self._series: list[pd.DataFrame] = []

    def write_requests(self, records: list[RequestRecord]) -> None:
        self.records.extend(records)

    def write_timeseries(self, frame: pd.DataFrame) -> None:
        self._series.append(frame)

    def requests(self, columns: list[str] | None = None) -> pd.DataFrame:
        frame = requests_frame(self.records)
        return frame[columns] if columns else frame

    def timeseries(self, max_rows: int | None = None) -> pd.DataFrame:
        frame = pd.concat(self._series, ignore_index=True) if self._series else pd.DataFrame()
        return thin(frame, max_rows)

    def close(self) -> None:
        """Nothing to close: the rows stay in memory."""


class FileSink:
    """Appends to ``folder/requests.<fmt>`` and ``folder/timeseries.<fmt>`` (fmt: parquet or csv).
    With ``keep``, the rows written stay in memory as well, and :meth:`requests` and
    :meth:`timeseries` return them without reading the files back."""

    def __init__(self, folder: Path, fmt: str = "parquet", keep: bool = False):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.fmt = fmt
        self._writers: dict[str, Any] = {}
        self._kept: dict[str, list[pd.DataFrame]] | None = (
            {"requests": [], "timeseries": []} if keep else None
        )

    def path(self, stem: str) -> Path:
        return self.folder / f"{stem}.{self.fmt}"

    def write_requests(self, records: list[RequestRecord]) -> None:
        self._append("requests", requests_frame(records))

    def write_timeseries(self, frame: pd.DataFrame) -> None:
        self._append("timeseries", frame)

    def _append(self, stem: str, frame: pd.DataFrame) -> None:
        if self._kept is not None and stem in self._kept:
            self._kept[stem].append(frame)
        if self.fmt == "csv":
            first = stem not in self._writers
            frame.to_csv(self.path(stem), mode="w" if first else "a", header=first, index=False)
            self._writers[stem] = True
            return
        writer = self._writers.get(stem)
        table = pa.Table.from_pandas(frame, preserve_index=False)
        if writer is None:
            # Dictionary-encode text columns only: on the numeric columns (most of them) dictionary
            # pages cost 2.4x the write time of plain ones and make bigger files.
            text = [
                f.name for f in table.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            ]
            writer = self._writers[stem] = pq.ParquetWriter(
                self.path(stem), table.schema, use_dictionary=text
            )
        writer.write_table(table.cast(writer.schema))

    def write_table(self, stem: str, frame: pd.DataFrame) -> None:
        """A whole table written at once beside the streamed ones (``folder/<stem>.<fmt>``)."""
        self._append(stem, frame)
        writer = self._writers[stem]
        if not isinstance(writer, bool):
            writer.close()
        self._writers[stem] = True

    def requests(self, columns: list[str] | None = None) -> pd.DataFrame:
        if self._kept is None:
            return read_requests(self.path("requests"), columns)
        frame = self._kept_frame("requests")
        return frame[columns] if columns else frame

    def timeseries(self, max_rows: int | None = None) -> pd.DataFrame:
        if self._kept is None:
            return read_thinned(self.path("timeseries"), max_rows)
        return thin(self._kept_frame("timeseries"), max_rows)

    def _kept_frame(self, stem: str) -> pd.DataFrame:
        """The rows kept of ``stem``, as one frame (concatenated once)."""
        assert self._kept is not None
        frames = self._kept[stem]
        if len(frames) != 1:
            frames[:] = [pd.concat(frames, ignore_index=True)] if frames else [pd.DataFrame()]
        return frames[0]

    def close(self) -> None:
        if "requests" not in self._writers:  # a run that booked no request still writes the table
            self._append("requests", requests_frame([]))
        for writer in self._writers.values():
            if not isinstance(writer, bool):
                writer.close()
        self._writers = {stem: True for stem in self._writers}


def read_requests(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    if path.suffix != ".csv":
        return pd.read_parquet(path, columns=columns)
    # CSV cannot tell an empty string from a missing one: read the text columns as text.
    text = [name for name in ("outcome", "reason") if columns is None or name in columns]
    frame = pd.read_csv(path, usecols=columns, dtype=dict.fromkeys(text, "string"))
    for name in text:
        frame[name] = frame[name].fillna("").astype(str)
    return frame


def thin(frame: pd.DataFrame, max_rows: int | None) -> pd.DataFrame:
    """Every k-th row, so that at most ``max_rows`` remain (plots do not need every sample)."""
    if max_rows is None or len(frame) <= max_rows:
        return frame
    stride = -(-len(frame) // max_rows)
    return frame.iloc[::stride].reset_index(drop=True)


def read_thinned(path: Path, max_rows: int | None) -> pd.DataFrame:
    """Read a time series file, keeping every k-th row, one chunk at a time (memory stays bounded)."""
    if path.suffix == ".csv":
        if max_rows is None:
            return pd.read_csv(path)
        total = sum(1 for _ in path.open()) - 1
        stride = max(1, -(-total // max_rows))
        return pd.read_csv(path, skiprows=lambda row: row > 0 and (row - 1) % stride != 0)
    parquet = pq.ParquetFile(path)
    total = parquet.metadata.num_rows
    if max_rows is None or total <= max_rows:
        return parquet.read().to_pandas()
    stride = -(-total // max_rows)
    kept, offset = [], 0
    for batch in parquet.iter_batches(batch_size=65_536):
        frame = batch.to_pandas()
        start = (-offset) % stride
        kept.append(frame.iloc[start::stride])
        offset += len(frame)
    return pd.concat(kept, ignore_index=True)
