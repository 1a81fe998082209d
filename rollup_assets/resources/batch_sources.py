"""Where the rows of an ingest batch come from: a Parquet or CSV file, or data in memory (a
pandas DataFrame, an Arrow table, a stream of Arrow record batches).

A source yields its rows as they are, chunk by chunk (at most `CHUNK_ROWS` rows each), as often
as an ingest reads them: validation, then the upsert, then again when a MERGE is retried.
`BatchReader` converts and checks every chunk the same way whatever its source, so the rules
and the row numbers (0-based, in the source's order) are the same for a file and for memory.

A stream (`pa.RecordBatchReader`) can be read once only: its first pass writes its batches, as
they arrive, to an Arrow file in a temporary directory, and later passes read that file back
chunk by chunk, so a stream larger than memory is never held whole. `close()` (or leaving the
`with` block) removes the file.
"""

import datetime as dt
import math
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from rollup_assets.model.errors import IngestValidationError

CHUNK_ROWS = 262_144


class BatchSource(ABC):
    """The raw rows of one batch, for the archive `archive`. `label` names the batch in
    messages; `file` is the file name an ingest's commit records (None for data in memory)."""

    def __init__(self, archive: str, label: str, file: str | None = None) -> None:
        self.archive = archive
        self.label = label
        self.file = file

    @abstractmethod
    def chunks(self) -> Iterator[pa.Table]:
        """The rows, in order, in chunks of at most `CHUNK_ROWS`; may be called again."""

    def close(self) -> None:  # noqa: B027 (most sources leave nothing behind)
        """Release what reading the source left behind (nothing, for most sources)."""

    def __enter__(self) -> "BatchSource":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


class FileSource(BatchSource):
    """A Parquet (.parquet, .pq) or CSV (.csv, .txt) file. In a CSV file every column is read as
    text and only an empty cell is missing."""

    def __init__(self, archive: str, path: str | Path) -> None:
        self.path = Path(path)
        super().__init__(archive, self.path.name, self.path.name)

    def _refuse(self, reason: str) -> IngestValidationError:
        return IngestValidationError(self.archive, None, reason)

    def chunks(self) -> Iterator[pa.Table]:
        suffix = self.path.suffix.lower()
        if not self.path.exists():
            raise self._refuse(f"file {self.path} does not exist")
        if self.path.stat().st_size == 0:
            raise self._refuse(f"file {self.path} is empty")
        if suffix in (".parquet", ".pq"):
            try:
                pf = pq.ParquetFile(self.path)
                for batch in pf.iter_batches(batch_size=CHUNK_ROWS):
                    yield pa.Table.from_batches([batch])
            except (pa.ArrowException, OSError) as exc:
                raise self._refuse(
                    f"{self.path.name} is not a readable Parquet file ({exc})"
                ) from None
        elif suffix in (".csv", ".txt"):
            try:
                reader = pcsv.open_csv(
                    self.path,
                    read_options=pcsv.ReadOptions(block_size=1 << 24),
                    convert_options=pcsv.ConvertOptions(
                        column_types=dict.fromkeys(self._csv_header(), pa.string()),
                        # Only an empty cell is missing: Arrow's default list would turn text
                        # such as "NA" or "null" into nulls, and "NaN" must reach the NaN check.
                        null_values=[""],
                        strings_can_be_null=True,
                    ),
                )
                for batch in reader:
                    yield from _sliced(pa.Table.from_batches([batch]))
            except (pa.ArrowException, OSError) as exc:
                raise self._refuse(f"{self.path.name} is not a readable CSV file ({exc})") from None
        else:
            raise self._refuse(f"unsupported file type '{suffix}' (use .parquet or .csv)")

    def _csv_header(self) -> list[str]:
        with open(self.path, encoding="utf-8-sig", errors="replace") as f:
            first = f.readline().strip()
        return [c.strip().strip('"') for c in first.split(",")]


class TableSource(BatchSource):
    """An Arrow table in memory (a pandas DataFrame is converted to one: `table_from_pandas`)."""

    def __init__(self, archive: str, table: pa.Table, label: str = "the Arrow table") -> None:
        super().__init__(archive, label)
        self.table = table

    def chunks(self) -> Iterator[pa.Table]:
        yield from _sliced(self.table)


class StreamSource(BatchSource):
    """A stream of record batches, read once: its first pass keeps each batch in a temporary
    Arrow file as it passes, and later passes read that file."""

    def __init__(
        self, archive: str, reader: pa.RecordBatchReader, label: str = "the record batch stream"
    ) -> None:
        super().__init__(archive, label)
        self.reader = reader
        self._dir: Path | None = None
        self._spilled: Path | None = None  # the whole stream, once the first pass has ended

    def chunks(self) -> Iterator[pa.Table]:
        if self._spilled is not None:
            yield from self._read_back(self._spilled)
        elif self._dir is not None:
            raise IngestValidationError(
                self.archive,
                None,
                f"{self.label} was read only in part (a record batch reader is read once)",
            )
        else:
            yield from self._first_pass()

    def _first_pass(self) -> Iterator[pa.Table]:
        self._dir = Path(tempfile.mkdtemp(prefix="rollups-ingest-"))
        path = self._dir / "batches.arrow"
        schema = self.reader.schema
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as spill:
            for batch in self.reader:
                for chunk in _sliced(pa.Table.from_batches([batch], schema=schema)):
                    spill.write_table(chunk)
                    yield chunk
        self._spilled = path

    @staticmethod
    def _read_back(path: Path) -> Iterator[pa.Table]:
        with pa.OSFile(str(path), "rb") as source:
            spilled = pa.ipc.open_file(source)
            for i in range(spilled.num_record_batches):
                yield pa.Table.from_batches([spilled.get_batch(i)])

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = self._spilled = None


def table_from_pandas(frame: pd.DataFrame) -> pa.Table:
    """`frame`'s columns as Arrow columns, in order, by position (its index is not a column).

    A column of mixed Python objects that Arrow cannot hold as one type (numbers and text,
    say) becomes text, which the ingest's conversion parses by the archive's type, so the first
    value that is not one is refused with its row, as a CSV cell would be.
    """
    arrays = []
    for i in range(frame.shape[1]):
        column = frame.iloc[:, i]
        try:
            arrays.append(pa.array(column, from_pandas=True))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            arrays.append(pa.array([_as_text(v) for v in column], pa.string()))
    return pa.Table.from_arrays(arrays, names=[str(c) for c in frame.columns])


def _as_text(value: object) -> str | None:
    """A Python value as a CSV file would hold it (ISO-8601 for instants; None when missing)."""
    if value is None or value is pd.NaT or value is pd.NA:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dt.date):  # datetime, date and pandas Timestamp alike
        return value.isoformat()
    return str(value)


def _sliced(table: pa.Table) -> Iterator[pa.Table]:
    """`table` in chunks of at most `CHUNK_ROWS` rows."""
    for offset in range(0, table.num_rows, CHUNK_ROWS):
        yield table.slice(offset, CHUNK_ROWS)
