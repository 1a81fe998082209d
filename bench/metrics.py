"""What the benchmark measures: elapsed time, peak memory, rows read, and progress lines.

Rows read are counted where they are read, not estimated:
  * by Spark executors: the `Input Metrics / Records Read` of every finished task, from the
    session's event log (the same numbers the Spark UI shows);
  * by the driver: every rollup-table Parquet file the delta-rs/Arrow side reads (sweeps, file
    rewrites, the Arrow read path), counted by a wrapper around `RollupStore._read_file`.
Both are timestamped, so a run's rows are those read between its start and end.
"""

import ctypes
import json
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import psutil
import pyarrow as pa

import rollup_assets.resources.raw_reads as raw_reads_module
import rollup_assets.services.partials as partials_module
import rollup_assets.services.surface_files as surface_files_module
import rollup_assets.services.surface_reads as surface_module
from rollup_assets.model.specs import RawArchiveSpec, RollupSpec
from rollup_assets.resources.fill import Fill
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.raw_tables import RawTables
from rollup_assets.resources.rollup_store import RollupStore

MB = 1024 * 1024
try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6")
except OSError:  # not glibc
    _LIBC = None
_T0 = time.monotonic()


def say(message: str) -> None:
    """One progress line with the time since the benchmark started (the CLI's output)."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", flush=True)


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


class MemorySampler:
    """Samples this process's RSS (the driver) and its children's (the Spark JVM) every
    `interval` seconds in a daemon thread; `window()` yields the peaks of one step."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.process = psutil.Process()
        self._lock = threading.Lock()
        self._driver_peak = 0
        self._driver_peak_at = ""  # the main thread's code when the driver's peak was sampled
        self._jvm_peak = 0
        self._jvm_ever = 0
        self._children: list[psutil.Process] = []
        self._listed = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-memory", daemon=True)

    def start(self) -> "MemorySampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _sample(self) -> tuple[int, int]:
        driver = self.process.memory_info().rss
        now = time.monotonic()
        if now - self._listed > 5.0:
            # Listing children scans /proc; the JVM is a direct child, so do it rarely.
            self._children = self.process.children()
            self._listed = now
        jvm = 0
        for child in self._children:
            try:
                jvm += child.memory_info().rss
            except psutil.Error:
                continue
        return driver, jvm

    def _loop(self) -> None:
        main = threading.main_thread().ident
        while not self._stop.wait(self.interval):
            driver, jvm = self._sample()
            with self._lock:
                if driver > self._driver_peak:
                    frame = sys._current_frames().get(main) if main is not None else None
                    self._driver_peak_at = _where(frame)
                self._driver_peak = max(self._driver_peak, driver)
                self._jvm_peak = max(self._jvm_peak, jvm)
                self._jvm_ever = max(self._jvm_ever, jvm)

    def reset(self) -> None:
        """Start a new step: memory freed by earlier steps is handed back to the system first
        (Arrow's pool and the C allocator keep freed pages), so a step's peak is its own."""
        pa.default_memory_pool().release_unused()
        if _LIBC is not None:
            _LIBC.malloc_trim(0)
        driver, jvm = self._sample()
        with self._lock:
            self._driver_peak, self._jvm_peak = driver, jvm
            self._driver_peak_at = ""

    def peaks(self) -> tuple[float, float]:
        """(driver, children) peak RSS in MiB since the last reset."""
        driver, jvm = self._sample()
        with self._lock:
            return max(self._driver_peak, driver) / MB, max(self._jvm_peak, jvm) / MB

    def peak_at(self) -> str:
        """Where the main thread was when the driver's peak since the last reset was sampled."""
        with self._lock:
            return self._driver_peak_at

    def jvm_lifetime_peak(self) -> float:
        """The children's (Spark JVM's) peak RSS in MiB since the sampler started."""
        with self._lock:
            return self._jvm_ever / MB


def _where(frame: FrameType | None, depth: int = 6) -> str:
    """The innermost project functions of a stack, innermost first: `module.function:line`."""
    out: list[str] = []
    while frame is not None and len(out) < depth:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(("rollup_assets.", "resources.", "sensors.")):
            out.append(f"{module.rsplit('.', 1)[-1]}.{frame.f_code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(out)


def lifetime_peak_rss_mb() -> float:
    """This process's peak RSS over its whole life (getrusage: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MB if sys.platform == "darwin" else peak / 1024


class SparkEventLog:
    """Finished tasks' input records, read incrementally from the session's event log."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._offset = 0
        self._file: Path | None = None
        self.tasks: list[tuple[float, int]] = []  # (finish time in epoch seconds, records read)
        # Spark jobs: (start, end in epoch seconds, the driver call that ran them)
        self.jobs: list[tuple[float, float, str]] = []
        self._job_starts: dict[int, tuple[float, str]] = {}

    def _current(self) -> Path | None:
        if self._file is None or not self._file.exists():
            files = sorted(self.directory.glob("*"), key=lambda p: p.stat().st_mtime)
            if files:
                self._file = files[-1]
                self._offset = 0
        if self._file is not None and not self._file.exists():
            # Spark renames `<app>.inprogress` to `<app>` when the session stops.
            done = self._file.with_name(self._file.name.removesuffix(".inprogress"))
            self._file = done if done.exists() else None
        return self._file

    def settle(self, quiet: float = 0.3, limit: float = 5.0) -> None:
        """Wait until the listener bus has flushed (the log stops growing), then read it."""
        deadline = time.monotonic() + limit
        last = -1
        while time.monotonic() < deadline:
            path = self._current()
            size = path.stat().st_size if path is not None and path.exists() else 0
            if size == last:
                break
            last = size
            time.sleep(quiet)
        self._read()

    def _read(self) -> None:
        path = self._current()
        if path is None:
            return
        with open(path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        complete = chunk.rfind(b"\n") + 1
        self._offset += complete
        for line in chunk[:complete].splitlines():
            if b'"SparkListenerJobStart"' in line:
                event = json.loads(line)
                site = (event.get("Properties") or {}).get("callSite.short", "")
                self._job_starts[event["Job ID"]] = (event["Submission Time"] / 1000.0, site)
                continue
            if b'"SparkListenerJobEnd"' in line:
                event = json.loads(line)
                began, site = self._job_starts.pop(event["Job ID"], (None, ""))
                if began is not None:
                    self.jobs.append((began, event["Completion Time"] / 1000.0, site))
                continue
            if b'"SparkListenerTaskEnd"' not in line:
                continue
            event = json.loads(line)
            metrics = event.get("Task Metrics") or {}
            records = (metrics.get("Input Metrics") or {}).get("Records Read", 0)
            finished = event.get("Task Info", {}).get("Finish Time", 0) / 1000.0
            self.tasks.append((finished, int(records)))

    def rows_between(self, start: float, end: float) -> int:
        return sum(n for t, n in self.tasks if start <= t <= end)

    def job_seconds(
        self, start: float, end: float, phase: Callable[[str], str]
    ) -> dict[str, float]:
        """Wall time of the Spark jobs that ran between `start` and `end`, by `phase(call site)`
        (overlapping jobs counted once), and `spark_total`."""
        jobs = sorted((b, e, phase(site)) for b, e, site in self.jobs if b >= start and e <= end)
        out: dict[str, float] = {}
        covered, total = 0.0, 0.0
        for b, e, name in jobs:
            lo = max(b, covered)
            if e > lo:
                out[name] = out.get(name, 0.0) + e - lo
                total += e - lo
            covered = max(covered, e)
        return {**{k: round(v, 2) for k, v in out.items()}, "spark_total": round(total, 2)}


class DriverReads:
    """Counts the rows read outside Spark's scans (installed once): every rollup-table,
    raw-table and surface-table file the driver reads (row groups read, before filtering), the
    change rows a correction reads from the change feed (`RawStore.changes`; change detection
    reads only its own commits' keys, uncounted), and the source rows the tasks of a
    first fill or of a job's named cells decode (`rollup_assets.resources.fill`, reported back by
    its tasks)."""

    def __init__(self) -> None:
        self.reads: list[tuple[float, int]] = []
        # (time, rows, what read them: the innermost service or store function on the stack)
        self.purposes: list[tuple[float, int, str]] = []
        self._originals: dict[str, Callable] = {}

    def _record(self, kind: str, rows: int) -> None:
        now = time.time()
        self.reads.append((now, rows))
        self.purposes.append((now, rows, f"{kind}: {_reader()}"))

    def install(self) -> None:
        if self._originals:
            return
        rollup_file = RollupStore._read_file
        raw_file = raw_reads_module._read_file
        changes = RawStore.changes

        def counted_rollup_file(
            store: RollupStore,
            spec: RollupSpec,
            f: dict,
            columns: Sequence[str] | None = None,
            *args: object,
        ) -> pa.Table:
            table = rollup_file(store, spec, f, columns, *args)
            self._record(spec.name, table.num_rows)
            return table

        def counted_raw_file(tables: RawTables, spec: RawArchiveSpec, f: dict, *args: object):
            table = raw_file(tables, spec, f, *args)  # type: ignore[arg-type]
            self._record("raw", table.num_rows)
            return table

        def counted_changes(
            store: RawStore, *args: object, **kwargs: object
        ) -> tuple[pa.Table, int]:
            rows, read = changes(store, *args, **kwargs)  # type: ignore[arg-type]
            self._record("change feed", read)
            return rows, read

        write_fill = RollupStore.write_fill

        def counted_write_fill(store: RollupStore, spark: object, fill: Fill, **kw: object):
            written = write_fill(store, spark, fill, **kw)  # type: ignore[arg-type]
            self._record(f"{fill.source.name} (first fill tasks)", written.rows_read)
            return written

        run_partials = partials_module.run_partials

        def counted_run_partials(spark: object, fill: Fill, cells: pa.Table):
            rows, read = run_partials(spark, fill, cells)  # type: ignore[arg-type]
            self._record(f"{fill.source.name} (partials tasks)", read)
            return rows, read

        read_arrow = RollupStore.read_arrow
        surface_file = surface_module.read_row_groups

        def counted_surface_file(table_uri: str, *args: object, **kwargs: object) -> pa.Table:
            table = surface_file(table_uri, *args, **kwargs)
            name = table_uri.rstrip("/").rsplit("/", 1)[-1]
            self._record(f"{name.removesuffix('__active')} surface", table.num_rows)
            return table

        def asked_read_arrow(store: RollupStore, *args: object, **kwargs: object) -> pa.Table:
            _ASKED[0] = _reader()
            return read_arrow(store, *args, **kwargs)

        self._originals = {
            "rollup": rollup_file,
            "raw": raw_file,
            "changes": changes,
            "read_arrow": read_arrow,
            "surface": surface_file,
            "write_fill": write_fill,
            "run_partials": run_partials,
        }
        partials_module.run_partials = counted_run_partials  # type: ignore[assignment]
        RollupStore.write_fill = counted_write_fill  # type: ignore[method-assign]
        surface_module.read_row_groups = counted_surface_file  # type: ignore[assignment]
        surface_files_module.read_row_groups = counted_surface_file  # type: ignore[assignment]
        RollupStore.read_arrow = asked_read_arrow  # type: ignore[method-assign]
        RollupStore._read_file = counted_rollup_file  # type: ignore[method-assign]
        raw_reads_module._read_file = counted_raw_file
        RawStore.changes = counted_changes  # type: ignore[method-assign,assignment]

    def uninstall(self) -> None:
        if self._originals:
            RollupStore._read_file = self._originals["rollup"]  # type: ignore[method-assign]
            raw_reads_module._read_file = self._originals["raw"]
            RawStore.changes = self._originals["changes"]  # type: ignore[method-assign]
            RollupStore.read_arrow = self._originals["read_arrow"]  # type: ignore[method-assign]
            surface_module.read_row_groups = self._originals["surface"]
            surface_files_module.read_row_groups = self._originals["surface"]
            RollupStore.write_fill = self._originals["write_fill"]  # type: ignore[method-assign]
            partials_module.run_partials = self._originals["run_partials"]
            self._originals = {}

    def rows_between(self, start: float, end: float) -> int:
        return sum(n for t, n in self.reads if start <= t <= end)

    def by_purpose(self, start: float, end: float) -> dict[str, int]:
        """Rows read between `start` and `end` by table and the function that read them."""
        out: dict[str, int] = {}
        for t, n, purpose in self.purposes:
            if start <= t <= end:
                out[purpose] = out.get(purpose, 0) + n
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


_ASKED: list[str] = ["other"]  # what the last `RollupStore.read_arrow` call was for


def _reader() -> str:
    """The innermost function outside the stores (a service, a compute step) that asked for
    the read: `module.function`. A thread of the stores' own reader pool has none on its
    stack: its files were asked for by the last `RollupStore.read_arrow` call."""
    frame = sys._getframe(1)
    first = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("rollup_assets."):
            return f"{module.rsplit('.', 1)[-1]}.{frame.f_code.co_name}"
        if first is None and module.startswith("resources."):
            first = f"{module.rsplit('.', 1)[-1]}.{frame.f_code.co_name}"
        frame = frame.f_back
    if threading.current_thread() is not threading.main_thread():
        return _ASKED[0]
    return first or "other"


@dataclass
class Probe:
    """The instruments of one benchmark process."""

    memory: MemorySampler
    events: SparkEventLog
    driver: DriverReads = field(default_factory=DriverReads)

    def rows_read(self, start: float, end: float) -> dict[str, int]:
        self.events.settle()
        spark = self.events.rows_between(start, end)
        driver = self.driver.rows_between(start, end)
        return {"spark": spark, "driver": driver, "total": spark + driver}


@dataclass
class Step:
    """Measurements of one timed step (filled in when the `measure` block ends)."""

    name: str
    started: float = 0.0
    ended: float = 0.0
    seconds: float = 0.0
    driver_peak_mb: float = 0.0
    driver_peak_at: str = ""
    jvm_peak_mb: float = 0.0
    rows_read: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "seconds": round(self.seconds, 3),
            "driver_peak_mb": round(self.driver_peak_mb, 1),
            "driver_peak_at": self.driver_peak_at,
            "jvm_peak_mb": round(self.jvm_peak_mb, 1),
            "rows_read": self.rows_read,
        }


@contextmanager
def measure(probe: Probe, name: str, rows: bool = True) -> Iterator[Step]:
    """Time a step, track its peak memory and (optionally) the rows it read; print progress."""
    step = Step(name)
    say(f"{name} ...")
    probe.memory.reset()
    step.started = time.time()
    t0 = time.monotonic()
    yield step
    step.seconds = time.monotonic() - t0
    step.ended = time.time()
    step.driver_peak_mb, step.jvm_peak_mb = probe.memory.peaks()
    step.driver_peak_at = probe.memory.peak_at()
    if rows:
        step.rows_read = probe.rows_read(step.started, step.ended)
    read = f", rows read {step.rows_read['total']:,}" if rows else ""
    say(f"{name}: {step.seconds:.1f}s, driver peak {step.driver_peak_mb:.0f} MiB{read}")


def delta_logs(root: Path) -> set[Path]:
    """Every Delta commit file under `root` (a local warehouse)."""
    return set(root.rglob("_delta_log/*.json"))


def written_since(root: Path, before: set[Path]) -> dict[str, int]:
    """What the Delta commits written under `root` since `before` (from `delta_logs`) added:
    data files, their bytes and their rows (from each add's statistics). A table's whole
    rewrite shows here as what it is, whatever wrote it."""
    out = {"files": 0, "bytes": 0, "rows": 0}
    for log in sorted(delta_logs(root) - before):
        for line in log.read_text(encoding="utf-8").splitlines():
            add = json.loads(line).get("add") if line.strip() else None
            if add:
                out["files"] += 1
                out["bytes"] += int(add["size"])
                out["rows"] += json.loads(add.get("stats") or "{}").get("numRecords", 0)
    return out
