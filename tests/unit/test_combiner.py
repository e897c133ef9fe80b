"""engine.worker.combiner.Combiner: batching of a worker process's starts and successes, and its
write-behind submissions (``wait=False``). Pure threading, no database."""

from __future__ import annotations

import threading
import time

import pytest

from engine.worker.combiner import Combiner


class Recorder:
    """A run_batch that records each batch and can be held while it runs."""

    def __init__(self, *, fail_on: str | None = None):
        self.batches: list[list[str]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail_on = fail_on

    def __call__(self, requests: list[str]) -> list[str]:
        self.entered.set()
        assert self.hold.wait(5)
        self.batches.append(list(requests))
        if self.fail_on in requests:
            raise RuntimeError(f"batch with {self.fail_on} failed")
        return [r.upper() for r in requests]


def _in_thread(fn) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return t, out


def _batch_in_flight(rec: Recorder) -> tuple[Combiner, threading.Thread, list]:
    """A Combiner over ``rec`` whose first batch ("first") is running, held until
    ``rec.hold`` is set; returns it, the lead thread and the list its result goes to."""
    c = Combiner(rec)
    rec.hold.clear()
    lead, lead_out = _in_thread(lambda: c.submit("first"))
    assert rec.entered.wait(5)
    return c, lead, lead_out


def _queued(c: Combiner, n: int) -> None:
    """Wait until ``n`` requests are queued behind the batch in flight."""
    while len(c._queue) < n:
        threading.Event().wait(0.001)


def test_a_request_with_no_batch_running_runs_at_once_alone():
    rec = Recorder()
    calls = []
    c = Combiner(rec)
    assert c.submit("a") == "A"
    assert c.submit("b", wait=False, on_result=lambda *a: calls.append(a)) == "B"
    assert rec.batches == [["a"], ["b"]]
    assert calls == []  # a request run by its own thread returns its result instead


def test_write_behind_requests_join_the_next_batch_and_get_their_result_by_callback():
    rec = Recorder()
    c, lead, lead_out = _batch_in_flight(rec)
    calls = []
    # A batch is in flight: these return at once, without a result.
    assert c.submit("x", wait=False, on_result=lambda res, err: calls.append(("x", res, err))) is None
    assert c.submit("y", wait=False, on_result=lambda res, err: calls.append(("y", res, err))) is None
    waiter, waiter_out = _in_thread(lambda: c.submit("z"))
    _queued(c, 3)
    rec.hold.set()
    lead.join(5)
    waiter.join(5)
    assert lead_out == ["FIRST"] and waiter_out == ["Z"]
    # The queued requests went together into one batch, after the one in flight.
    assert rec.batches == [["first"], ["x", "y", "z"]]
    assert sorted(calls) == [("x", "X", None), ("y", "Y", None)]


def test_queued_write_behind_requests_are_run_by_the_lead_before_it_returns_when_nobody_waits():
    rec = Recorder()
    c, lead, lead_out = _batch_in_flight(rec)
    calls = []
    for name in ("p", "q"):
        assert c.submit(name, wait=False, on_result=lambda res, err: calls.append(res)) is None
    rec.hold.set()
    lead.join(5)
    assert lead_out == ["FIRST"]
    assert rec.batches == [["first"], ["p", "q"]]
    assert sorted(calls) == ["P", "Q"]
    assert c._queue == [] and c._busy is False
    assert c.submit("after") == "AFTER"  # and the next request runs at once


def test_a_failed_batch_is_run_again_request_by_request_so_only_the_bad_request_fails():
    rec = Recorder(fail_on="bad")
    c, lead, lead_out = _batch_in_flight(rec)
    calls = []
    assert c.submit("bad", wait=False, on_result=lambda res, err: calls.append((res, err))) is None
    results, errors = [], []

    def wait_for_it():
        try:
            results.append(c.submit("other"))
        except RuntimeError as exc:
            errors.append(str(exc))

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    _queued(c, 2)
    rec.hold.set()
    lead.join(5)
    waiter.join(5)
    assert lead_out == ["FIRST"]
    # The shared batch failed; each request then ran alone: "other" succeeded, "bad" failed.
    assert rec.batches[1:] == [["bad", "other"], ["bad"], ["other"]]
    assert results == ["OTHER"] and errors == []
    assert len(calls) == 1 and calls[0][0] is None and str(calls[0][1]) == "batch with bad failed"


def test_a_request_failing_alone_raises_for_its_submitter():
    c = Combiner(Recorder(fail_on="bad"))
    with pytest.raises(RuntimeError, match="batch with bad failed"):
        c.submit("bad")
    assert c.submit("good") == "GOOD"


def test_a_callback_that_raises_does_not_stop_the_batch(caplog):
    rec = Recorder()
    c, lead, _ = _batch_in_flight(rec)
    seen = []

    def broken(res, err):
        raise ValueError("callback bug")

    c.submit("a", wait=False, on_result=broken)
    c.submit("b", wait=False, on_result=lambda res, err: seen.append(res))
    rec.hold.set()
    lead.join(5)
    assert seen == ["B"]
    assert "callback failed" in caplog.text


@pytest.mark.parametrize("threads", [8, 32])
def test_many_threads_each_get_their_own_result_and_every_request_runs_once(threads):
    rec = Recorder()
    c = Combiner(rec, max_batch=5)
    results: dict[int, list] = {}
    callbacks: list[str] = []
    lock = threading.Lock()

    def work(i: int):
        got = []
        for k in range(50):
            name = f"t{i}-{k}"
            if k % 2:
                r = c.submit(name, wait=False, on_result=lambda res, err: (lock.acquire(), callbacks.append(res),
                                                                           lock.release()))
                if r is not None:
                    got.append(r)
            else:
                got.append(c.submit(name))
        results[i] = got

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    ran = [r for batch in rec.batches for r in batch]
    assert sorted(ran) == sorted(f"t{i}-{k}" for i in range(threads) for k in range(50))
    assert all(len(b) <= 5 for b in rec.batches)
    returned = [r for got in results.values() for r in got]
    assert sorted(returned + callbacks) == sorted(r.upper() for r in ran)
    assert c._queue == [] and c._busy is False


# --- linger ---------------------------------------------------------------------------------------


def _released_three(linger: float) -> tuple[Combiner, Recorder]:
    """A Combiner with ``linger`` whose last batch released three waiting submitters just now
    (batches ["first"], then ["w1", "w2", "w3"])."""
    rec = Recorder()
    c = Combiner(rec, linger_seconds=linger)
    rec.hold.clear()
    first = _in_thread(lambda: c.submit("first"))
    assert rec.entered.wait(5)
    waiters = [_in_thread(lambda r=r: c.submit(r)) for r in ("w1", "w2", "w3")]
    _queued(c, 3)
    rec.hold.set()
    for t, _out in (first, *waiters):
        t.join(5)
    assert rec.batches == [["first"], ["w1", "w2", "w3"]]
    return c, rec


def test_a_lead_right_after_a_release_waits_for_the_released_threads_next_requests():
    c, rec = _released_three(linger=5.0)
    called = []
    # The first released thread's write-behind finds the combiner idle and leads: it waits for
    # the two other released threads' next requests instead of going alone.
    behind, behind_out = _in_thread(lambda: c.submit("s1", wait=False, on_result=lambda *a: called.append(a)))
    deadline = time.monotonic() + 5
    while not c._lingering and time.monotonic() < deadline:
        threading.Event().wait(0.001)
    assert c._lingering, "the write-behind went alone instead of waiting for the released threads"
    next_two = [_in_thread(lambda r=r: c.submit(r)) for r in ("n2", "n3")]
    for t in (behind, *(t for t, _out in next_two)):
        t.join(5)
    assert rec.batches[2] == ["s1", "n2", "n3"]
    assert behind_out == ["S1"] and [out for _t, out in next_two] == [["N2"], ["N3"]]
    assert called == []  # the lead's own write-behind: its result returned to it


def test_a_linger_ends_once_no_request_has_come_for_its_gap():
    c, rec = _released_three(linger=1.0)  # gap: 0.25 s
    began = time.monotonic()
    assert c.submit("x") == "X"  # the released threads send nothing (busy with long handlers)
    waited = time.monotonic() - began
    assert 0.2 <= waited < 0.9, waited
    assert rec.batches[2] == ["x"]


def test_a_request_long_after_the_last_release_runs_at_once():
    c, rec = _released_three(linger=1.0)
    time.sleep(1.05)  # longer than the linger since the release: nobody to wait for
    began = time.monotonic()
    assert c.submit("y") == "Y"
    assert time.monotonic() - began < 0.2
    assert rec.batches[2] == ["y"]


def _gated(gates: dict[str, threading.Event], batches: list):
    """A run_batch that records each batch and holds one holding a gated request until its gate opens."""
    def run(requests: list[str]) -> list[str]:
        batches.append(list(requests))
        for r in requests:
            if r in gates:
                assert gates[r].wait(5)
        return [r.upper() for r in requests]
    return run


def _wait_batches(batches: list, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(batches) < n and time.monotonic() < deadline:
        threading.Event().wait(0.001)
    assert len(batches) >= n


def test_a_successor_takes_its_batch_at_once_without_lingering():
    gates = {"first": threading.Event(), "w1": threading.Event()}
    batches: list = []
    c = Combiner(_gated(gates, batches), linger_seconds=5.0)  # a linger would last its gap: 1.25 s
    first = _in_thread(lambda: c.submit("first"))
    _wait_batches(batches, 1)
    waiters = [_in_thread(lambda r=r: c.submit(r)) for r in ("w1", "w2", "w3")]
    _queued(c, 3)
    gates["first"].set()
    _wait_batches(batches, 2)  # ["w1", "w2", "w3"] in flight: it releases three waiting submitters
    x, x_out = _in_thread(lambda: c.submit("x"))
    _queued(c, 1)
    began = time.monotonic()
    gates["w1"].set()
    x.join(5)
    assert x_out == ["X"] and time.monotonic() - began < 0.5  # it waited a batch already: no linger
    assert batches == [["first"], ["w1", "w2", "w3"], ["x"]]
    for t, _out in (first, *waiters):
        t.join(5)


def test_a_lead_kept_for_write_behind_requests_runs_them_at_once_without_lingering():
    gates = {"first": threading.Event(), "w1": threading.Event()}
    batches: list = []
    called: list = []
    c = Combiner(_gated(gates, batches), linger_seconds=5.0)
    first = _in_thread(lambda: c.submit("first"))
    _wait_batches(batches, 1)
    waiters = [_in_thread(lambda r=r: c.submit(r)) for r in ("w1", "w2", "w3")]
    _queued(c, 3)
    gates["first"].set()
    _wait_batches(batches, 2)  # w1 leads ["w1", "w2", "w3"], which releases three
    assert c.submit("b1", wait=False, on_result=lambda *a: called.append(a)) is None
    assert c.submit("b2", wait=False, on_result=lambda *a: called.append(a)) is None
    began = time.monotonic()
    gates["w1"].set()
    lead, lead_out = waiters[0]
    lead.join(5)  # w1 keeps the lead for b1 and b2 (nobody waits for them) and runs them before returning
    assert lead_out == ["W1"] and time.monotonic() - began < 0.5
    assert batches[2] == ["b1", "b2"] and sorted(called) == [("B1", None), ("B2", None)]
    for t, _out in (first, *waiters[1:]):
        t.join(5)
