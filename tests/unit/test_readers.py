"""Reading files side by side on the shared reader threads, a few at a time."""

import threading
import time

import pytest

from rollup_assets.resources.readers import read_ahead


class Reads:
    """A read that records how many reads ran or finished without being taken yet."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[int] = []
        self.taken = 0
        self.most_ahead = 0

    def __call__(self, item: int) -> int:
        with self.lock:
            self.started.append(item)
            self.most_ahead = max(self.most_ahead, len(self.started) - self.taken)
        time.sleep(0.002)
        if item == 13:
            raise FileNotFoundError(f"file {item}")
        return item * 10


def test_results_come_in_order_with_a_bounded_number_of_reads_ahead() -> None:
    reads = Reads()
    out = []
    for value in read_ahead(reads, range(12), ahead=2):
        out.append(value)
        time.sleep(0.01)  # a caller slower than its reads
        with reads.lock:
            reads.taken += 1
    assert out == [i * 10 for i in range(12)]
    # The one taken next and at most two more: never every file at once.
    assert reads.most_ahead <= 3, reads.most_ahead


def test_a_failed_read_raises_in_the_caller_and_later_reads_are_not_started() -> None:
    reads = Reads()
    with pytest.raises(FileNotFoundError, match="file 13"):
        list(read_ahead(reads, range(10, 40), ahead=2))
    time.sleep(0.05)  # reads already running finish; none is started after the failure
    assert max(reads.started) <= 16, reads.started


def test_a_caller_that_stops_early_leaves_no_reads_queued() -> None:
    reads = Reads()
    results = read_ahead(reads, range(100), ahead=3)
    assert [next(results), next(results)] == [0, 10]
    results.close()
    time.sleep(0.05)
    assert len(reads.started) <= 6, reads.started
