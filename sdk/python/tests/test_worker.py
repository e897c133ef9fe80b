"""The worker runtime against the fake server: hand-out, results, fencing, heartbeats,
cancellation, slots, drain, prompt stop, outages, Retry-After and log lines."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from fakeserver import FakeFlowForge, problem
from flowforge_sdk import NonRetryableError, PermissionDenied, TaskContext, Worker
from flowforge_sdk.client import Client
from flowforge_sdk.worker.heartbeat import next_heartbeat_delay
from helpers import RecordingBackoff, running


def test_polled_task_runs_its_handler_and_is_completed_with_its_fencing_token(fake: FakeFlowForge,
                                                                              make_worker: Any) -> None:
    worker = make_worker()
    seen: dict[str, Any] = {}

    @worker.task("resize")
    def resize(ctx: TaskContext) -> dict[str, Any]:
        seen.update(input=ctx.input, run_input=ctx.run_input, upstream=ctx.upstream, attempt=ctx.attempt,
                    task_run_id=ctx.task_run_id, workflow_run_id=ctx.workflow_run_id, token=ctx.fencing_token)
        return {"thumbnail": f"s3://thumbs/{ctx.input['width']}.png"}

    task_id = fake.enqueue("images", "resize", input={"width": 640}, run_input={"url": "https://x/1.png"},
                           upstream={"fetch": {"bytes": 1024}})
    with running(worker):
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "succeeded")

    task = fake.task_runs[task_id]
    assert task.output == {"thumbnail": "s3://thumbs/640.png"}
    assert seen == {"input": {"width": 640}, "run_input": {"url": "https://x/1.png"},
                    "upstream": {"fetch": {"bytes": 1024}}, "attempt": 1, "task_run_id": task_id,
                    "workflow_run_id": task.workflow_run_id, "token": 1}
    completes = fake.calls_to(f"/worker/tasks/{task_id}/complete")
    assert len(completes) == 1
    assert completes[0].body == {"fencing_token": 1, "output": {"thumbnail": "s3://thumbs/640.png"}}
    polls = fake.calls_to("/worker/poll")
    assert polls[0].body["queue"] == "images"
    assert polls[0].body["worker"]["id"] == worker.worker_id
    assert polls[0].body["worker"]["sdk"] == "flowforge-python/0.1.0"
    assert polls[0].body["worker"]["concurrency"] == 2
    assert polls[0].body["worker"]["host"]


def test_handler_exception_fails_the_attempt_as_retryable_and_the_retry_gets_the_next_token(
        fake: FakeFlowForge, make_worker: Any) -> None:
    worker = make_worker()
    attempts: list[tuple[int, int]] = []

    @worker.task("resize")
    def resize(ctx: TaskContext) -> str:
        attempts.append((ctx.attempt, ctx.fencing_token))
        if ctx.attempt == 1:
            raise ValueError("image too large")
        return "ok"

    task_id = fake.enqueue("images", "resize", max_attempts=2)
    with running(worker):
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "succeeded")

    (fail,) = fake.calls_to(f"/worker/tasks/{task_id}/fail")
    trace = fail.body.pop("traceback")
    assert fail.body == {"fencing_token": 1, "error": "ValueError: image too large", "retryable": True}
    assert fake.calls_to(f"/worker/tasks/{task_id}/complete")[0].body == {"fencing_token": 2, "output": "ok"}
    assert attempts == [(1, 1), (2, 2)]
    # The traceback went with the fail, from the handler's own frame on (the server keeps it
    # beside the error), not into the task's log.
    assert trace.startswith("Traceback (most recent call last):\n") and ", in resize\n" in trace
    assert trace.endswith("ValueError: image too large\n") and "attempt.py" not in trace
    assert [line for line in fake.task_runs[task_id].logs if line["level"] == "error"] == []


def test_non_retryable_error_fails_the_task_for_good(fake: FakeFlowForge, make_worker: Any) -> None:
    worker = make_worker()

    @worker.task("resize")
    def resize(ctx: TaskContext) -> None:
        raise NonRetryableError("the image is corrupt")

    task_id = fake.enqueue("images", "resize", max_attempts=3)
    with running(worker):
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "failed")
        time.sleep(0.4)  # a retry would have been handed out by now

    (fail,) = fake.calls_to(f"/worker/tasks/{task_id}/fail")
    assert fail.body.pop("traceback").endswith("NonRetryableError: the image is corrupt\n")
    assert fail.body == {"fencing_token": 1, "error": "NonRetryableError: the image is corrupt", "retryable": False}
    assert fake.task_runs[task_id].attempt == 1


def test_a_task_without_a_handler_fails_non_retryable_naming_the_handlers(fake: FakeFlowForge,
                                                                          make_worker: Any) -> None:
    worker = make_worker()
    worker.register("resize", lambda ctx: None)
    worker.register("crop", lambda ctx: None)
    task_id = fake.enqueue("images", "watermark", max_attempts=3)
    with running(worker):
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "failed")

    (call,) = fake.calls_to(f"/worker/tasks/{task_id}/fail")
    assert call.body["retryable"] is False
    assert call.body["error"] == ("no handler named 'watermark' in this worker (queue 'images'; its handlers: crop, "
                                  "resize); register one with @worker.task('watermark')")


def test_output_that_is_not_json_fails_non_retryable(fake: FakeFlowForge, make_worker: Any) -> None:
    worker = make_worker()
    worker.register("resize", lambda ctx: {"sizes": {640, 320}})
    task_id = fake.enqueue("images", "resize", max_attempts=2)
    with running(worker):
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "failed")
    (call,) = fake.calls_to(f"/worker/tasks/{task_id}/fail")
    assert call.body["retryable"] is False
    assert call.body["error"].startswith("the handler's output is not JSON (dict): Object of type set")
    assert fake.calls_to(f"/worker/tasks/{task_id}/complete") == []


def test_heartbeats_extend_the_lease_with_the_token(fake: FakeFlowForge, make_worker: Any) -> None:
    fake.heartbeat_interval = 0.1
    worker = make_worker()
    release = threading.Event()
    worker.register("resize", lambda ctx: release.wait(5) and "done")
    task_id = fake.enqueue("images", "resize")
    with running(worker):
        assert fake.wait_for(lambda: len(fake.calls_to(f"/worker/tasks/{task_id}/heartbeat")) >= 3)
        release.set()
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "succeeded")
    beats = fake.calls_to(f"/worker/tasks/{task_id}/heartbeat")
    assert all(b.body == {"fencing_token": 1} for b in beats)
    # One every interval, not a burst: 3 beats took at least 2 intervals.
    assert beats[2].at - beats[0].at >= 0.18


def test_the_next_heartbeat_is_due_within_a_third_of_the_last_lease_answered() -> None:
    assert next_heartbeat_delay(20.0, None) == 20.0  # no lease said: the poll's interval
    assert next_heartbeat_delay(20.0, 60.0) == 20.0  # the interval is sooner than a third of the lease
    assert next_heartbeat_delay(20.0, 9.0) == 3.0  # a lease cut short by the attempt's timeout
    assert next_heartbeat_delay(20.0, 0.3) == 0.5  # the floor
    assert next_heartbeat_delay(0.2, 0.3) == 0.2  # a shorter interval stands


def test_heartbeats_follow_a_shorter_lease_the_server_answers(fake: FakeFlowForge, make_worker: Any) -> None:
    # The poll leases for 30 s, beats every 1.5 s; then each heartbeat answers (and grants) 1.2 s,
    # as the server does near the attempt's timeout: beating every 1.5 s would lose the lease.
    fake.heartbeat_interval = 1.5
    fake.heartbeat_lease_seconds = 1.2
    worker = make_worker()
    leases: list[Any] = []

    @worker.task("resize")
    def resize(ctx: TaskContext) -> str:
        ctx.wait(3.5)
        leases.append(ctx.lease_expires_at)
        ctx.raise_if_cancelled()
        return "done"

    task_id = fake.enqueue("images", "resize")
    with running(worker):
        assert fake.wait_for(lambda: worker.stats["reported"] + worker.stats["dropped"] == 1, timeout=10)
    assert fake.task_runs[task_id].state == "succeeded", fake.task_runs[task_id].events
    beats = [c.at for c in fake.calls_to(f"/worker/tasks/{task_id}/heartbeat")]
    gaps = [later - earlier for earlier, later in zip(beats, beats[1:], strict=False)]
    assert len(beats) >= 4 and all(0.35 <= gap <= 0.8 for gap in gaps), gaps  # a third of 1.2 s: every 0.5 s
    assert leases[0] is not None


def test_a_polls_short_lease_paces_the_heartbeats_even_when_their_answers_omit_it(fake: FakeFlowForge,
                                                                                  make_worker: Any) -> None:
    fake.lease_seconds = 1.2  # the poll's lease: the attempt's timeout is near
    fake.heartbeat_interval = 5.0
    fake.heartbeat_sends_lease = False  # an answer without lease_seconds: keep to the last lease known
    worker = make_worker()

    @worker.task("resize")
    def resize(ctx: TaskContext) -> str:
        ctx.wait(2.5)
        ctx.raise_if_cancelled()
        return "done"

    task_id = fake.enqueue("images", "resize")
    with running(worker):
        assert fake.wait_for(lambda: worker.stats["reported"] + worker.stats["dropped"] == 1, timeout=10)
    assert fake.task_runs[task_id].state == "succeeded", fake.task_runs[task_id].events
    beats = fake.calls_to(f"/worker/tasks/{task_id}/heartbeat")
    assert len(beats) >= 3  # every 0.5 s (a third of 1.2 s, the floor), not every 5 s


def test_heartbeat_409_cancels_the_task_and_its_late_result_is_not_sent(fake: FakeFlowForge,
                                                                        make_worker: Any) -> None:
    fake.heartbeat_interval = 0.1
    worker = make_worker()
    observed: dict[str, Any] = {}
    started = threading.Event()

    @worker.task("resize")
    def resize(ctx: TaskContext) -> str:
        started.set()
        observed["cancelled_while_waiting"] = ctx.wait(10)
        observed["reason"] = ctx.cancel_reason
        return "late result"

    task_id = fake.enqueue("images", "resize")
    with running(worker):
        assert started.wait(5)
        fake.cancel(task_id)
        assert fake.wait_for(lambda: "reason" in observed, timeout=5)
        assert fake.wait_for(lambda: len(worker.held) == 0, timeout=5)
        time.sleep(0.3)

    assert observed == {"cancelled_while_waiting": True, "reason": "cancelled"}
    assert fake.calls_to(f"/worker/tasks/{task_id}/complete") == []
    assert fake.calls_to(f"/worker/tasks/{task_id}/fail") == []
    assert worker.stats["dropped"] == 1 and worker.stats["reported"] == 0


def test_a_lost_lease_sets_cancelled_with_its_reason(fake: FakeFlowForge, make_worker: Any) -> None:
    fake.heartbeat_interval = 0.1
    worker = make_worker()
    reasons: list[str | None] = []

    @worker.task("resize")
    def resize(ctx: TaskContext) -> None:
        ctx.cancel_event.wait(10)
        reasons.append(ctx.cancel_reason)
        ctx.raise_if_cancelled()

    task_id = fake.enqueue("images", "resize")
    with running(worker):
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "running")
        fake.expire_lease(task_id)
        assert fake.wait_for(lambda: bool(reasons), timeout=5)
        assert fake.wait_for(lambda: len(worker.held) == 0, timeout=5)
    assert reasons == ["lease_expired"]
    assert fake.calls_to(f"/worker/tasks/{task_id}/complete") == []
    assert fake.calls_to(f"/worker/tasks/{task_id}/fail") == []


def test_a_task_handed_out_again_runs_as_a_new_generation_and_the_old_result_is_refused(
        fake: FakeFlowForge, make_worker: Any) -> None:
    fake.heartbeat_interval = 30  # no heartbeat in the test: the first generation never learns it was lost
    worker = make_worker(concurrency=2)
    release_first = threading.Event()

    @worker.task("resize")
    def resize(ctx: TaskContext) -> str:
        if ctx.fencing_token == 1:
            release_first.wait(10)
        return f"generation {ctx.fencing_token}"

    task_id = fake.enqueue("images", "resize", max_attempts=2)
    with running(worker):
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "running")
        fake.reap(task_id)  # the lease ran out on the server: the task is handed out again
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "succeeded")
        assert fake.wait_for(lambda: len(worker.held) == 1)  # the first generation still runs, in its own slot
        release_first.set()
        assert fake.wait_for(lambda: len(worker.held) == 0)

    assert [c.body["fencing_token"] for c in fake.calls_to(f"/worker/tasks/{task_id}/complete")] == [2, 1]
    assert fake.task_runs[task_id].output == "generation 2"
    assert fake.task_runs[task_id].events[-1] == "stale_completion_rejected"
    assert worker.held.most_held == 2 and worker.stats == {**worker.stats, "reported": 1, "dropped": 1}


def test_concurrency_never_exceeds_the_slots_and_polls_ask_for_free_slots_only(fake: FakeFlowForge,
                                                                              make_worker: Any) -> None:
    worker = make_worker(concurrency=3)
    lock = threading.Lock()
    running_now = [0]
    most = [0]

    @worker.task("resize")
    def resize(ctx: TaskContext) -> int:
        with lock:
            running_now[0] += 1
            most[0] = max(most[0], running_now[0])
        time.sleep(0.05 + 0.1 * (ctx.input["n"] % 3))  # staggered: slots free up one at a time
        with lock:
            running_now[0] -= 1
        return ctx.input["n"]

    ids = [fake.enqueue("images", "resize", input={"n": n}) for n in range(12)]
    with running(worker):
        assert fake.wait_for(lambda: all(fake.task_runs[i].state == "succeeded" for i in ids), timeout=15)

    assert fake.most_held[worker.worker_id] == 3  # the server never had more than 3 out with this worker
    assert most[0] == 3
    assert [fake.task_runs[i].output for i in ids] == list(range(12))
    polls = fake.calls_to("/worker/poll")
    assert all(1 <= p.body["max_tasks"] <= 3 for p in polls)
    assert polls[0].body["max_tasks"] == 3


def test_stop_drains_in_flight_tasks_and_polls_no_more(fake: FakeFlowForge, make_worker: Any) -> None:
    worker = make_worker(concurrency=2)
    release = threading.Event()
    started = threading.Semaphore(0)

    @worker.task("resize")
    def resize(ctx: TaskContext) -> str:
        started.release()
        release.wait(10)
        return f"done {ctx.input['n']}"

    ids = [fake.enqueue("images", "resize", input={"n": n}) for n in range(2)]
    with running(worker) as runner:
        assert started.acquire(timeout=5) and started.acquire(timeout=5)
        worker.stop()
        stop_at = time.monotonic()
        time.sleep(0.5)  # longer than a poll: a poll after the stop would show
        assert runner.thread.is_alive(), "run() returned before its tasks finished"
        late = fake.enqueue("images", "resize", input={"n": 99})
        release.set()
        assert runner.join(10)
    assert runner.error is None
    assert [fake.task_runs[i].output for i in ids] == ["done 0", "done 1"]
    assert fake.task_runs[late].state == "ready"  # nobody took it: the worker stopped polling
    assert [p for p in fake.calls_to("/worker/poll") if p.at > stop_at] == []


def test_an_idle_worker_asked_to_stop_stops_promptly_not_after_its_long_poll(fake: FakeFlowForge,
                                                                            make_worker: Any) -> None:
    worker = make_worker(poll_wait_seconds=30)
    worker.register("resize", lambda ctx: "ran")
    with running(worker) as runner:
        assert fake.wait_for(lambda: len(fake.calls_to("/worker/poll")) == 1)
        time.sleep(0.3)  # the poll waits on the server, for up to 30 s
        began = time.monotonic()
        worker.stop()
        assert runner.join(10)
        took = time.monotonic() - began
    assert took < 5, f"stopping took {took:.1f} s"
    assert runner.error is None
    assert len(fake.calls_to("/worker/poll")) == 1


def test_a_poll_cut_off_by_a_stop_claims_nothing(fake: FakeFlowForge, make_worker: Any) -> None:
    worker = make_worker(poll_wait_seconds=30)
    worker.register("resize", lambda ctx: "ran")
    with running(worker) as runner:
        assert fake.wait_for(lambda: len(fake.calls_to("/worker/poll")) == 1)
        time.sleep(0.3)
        worker.stop()
        time.sleep(0.2)
        late = fake.enqueue("images", "resize")  # ready while the stopping worker's poll is still open
        assert runner.join(10)
    time.sleep(0.3)
    assert (fake.task_runs[late].state, fake.task_runs[late].attempt) == ("ready", 0)


def test_tasks_a_poll_was_already_answering_when_the_stop_came_still_run(fake: FakeFlowForge,
                                                                        make_worker: Any) -> None:
    fake.poll_answer_delay = 0.5  # claimed and started, the answer on its way
    worker = make_worker(poll_wait_seconds=30)
    worker.register("resize", lambda ctx: "ran")
    with running(worker) as runner:
        assert fake.wait_for(lambda: len(fake.calls_to("/worker/poll")) == 1)
        time.sleep(0.2)
        task_id = fake.enqueue("images", "resize")
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "running")
        worker.stop()
        assert runner.join(10)
    assert (fake.task_runs[task_id].state, fake.task_runs[task_id].output) == ("succeeded", "ran")
    assert worker.stats["reported"] == 1


def test_drain_gives_up_after_its_timeout(fake: FakeFlowForge, make_worker: Any) -> None:
    worker = make_worker(drain_timeout_seconds=0.5)
    stuck = threading.Event()
    worker.register("resize", lambda ctx: stuck.wait(30))
    task_id = fake.enqueue("images", "resize")
    with running(worker) as runner:
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "running")
        time.sleep(0.1)
        began = time.monotonic()
        worker.stop()
        assert runner.join(5)
        assert 0.4 <= time.monotonic() - began < 3
    stuck.set()
    assert fake.calls_to(f"/worker/tasks/{task_id}/complete") == []


def test_worker_reconnects_with_backoff_when_the_server_comes_back(fake: FakeFlowForge, make_worker: Any) -> None:
    backoff = RecordingBackoff(initial_seconds=0.05, max_seconds=0.4)
    worker = make_worker(backoff=backoff)
    worker.register("resize", lambda ctx: {"ok": True})
    fake.go_down()
    with running(worker):
        time.sleep(1.2)  # polls keep failing: connection refused
        failures = worker.stats["poll_failures"]
        fake.come_back()
        task_id = fake.enqueue("images", "resize")
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "succeeded", timeout=10)

    assert failures >= 4
    # Exponential without jitter here (the rng is fixed): 0.05, 0.1, 0.2, then capped at 0.4.
    assert backoff.delays[:5] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.4])
    assert fake.task_runs[task_id].output == {"ok": True}


def test_a_result_is_kept_while_the_server_is_down_and_reported_when_it_is_back(fake: FakeFlowForge,
                                                                                make_worker: Any) -> None:
    worker = make_worker(backoff=RecordingBackoff(initial_seconds=0.05, max_seconds=0.2))
    release = threading.Event()
    worker.register("resize", lambda ctx: release.wait(10) and {"thumbnail": "t.png"})
    task_id = fake.enqueue("images", "resize")
    with running(worker):
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "running")
        fake.go_down()
        release.set()
        time.sleep(0.8)  # the completion fails a few times
        assert len(worker.held) == 1  # still held: the result is not given up
        fake.come_back()
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "succeeded", timeout=10)
    assert fake.task_runs[task_id].output == {"thumbnail": "t.png"}
    assert [c.body["fencing_token"] for c in fake.calls_to(f"/worker/tasks/{task_id}/complete")] == [1]


def test_completion_is_retried_after_a_503_and_lands(fake: FakeFlowForge, make_worker: Any) -> None:
    worker = make_worker()
    worker.register("resize", lambda ctx: "out")
    fake.inject("POST", r"/complete/$", 503)
    task_id = fake.enqueue("images", "resize")
    with running(worker):
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "succeeded")
    calls = fake.calls_to(f"/worker/tasks/{task_id}/complete")
    assert [c.body for c in calls] == [{"fencing_token": 1, "output": "out"}] * 2
    assert worker.stats["reported"] == 1


def test_completion_retry_stops_on_409_when_the_first_try_had_landed(fake: FakeFlowForge, make_worker: Any) -> None:
    worker = make_worker()
    worker.register("resize", lambda ctx: "out")
    # The first completion is recorded but its answer is lost (a 503 from a proxy); the retry
    # is refused as stale; the worker must stop there.
    fake.inject("POST", r"/complete/$", 503, apply=True)
    task_id = fake.enqueue("images", "resize")
    with running(worker):
        assert fake.wait_for(lambda: len(fake.calls_to(f"/worker/tasks/{task_id}/complete")) == 2)
        assert fake.wait_for(lambda: len(worker.held) == 0)
        time.sleep(0.4)
    assert len(fake.calls_to(f"/worker/tasks/{task_id}/complete")) == 2
    assert fake.task_runs[task_id].state == "succeeded" and fake.task_runs[task_id].output == "out"
    assert "stale_completion_rejected" in fake.task_runs[task_id].events


def test_a_429_on_poll_waits_its_retry_after(fake: FakeFlowForge, make_worker: Any) -> None:
    worker = make_worker()
    worker.register("resize", lambda ctx: None)
    fake.inject("POST", r"/worker/poll/$", 429, headers={"Retry-After": "1"})
    with running(worker):
        assert fake.wait_for(lambda: len(fake.calls_to("/worker/poll")) >= 2, timeout=5)
    first, second = fake.calls_to("/worker/poll")[:2]
    assert second.at - first.at >= 0.95
    assert worker.stats["polls_deferred"] == 1 and worker.stats["poll_failures"] == 0


def test_a_503_poll_capacity_waits_its_retry_after_and_is_logged_once_as_a_warning(
        fake: FakeFlowForge, make_worker: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="flowforge_sdk")
    worker = make_worker()
    worker.register("resize", lambda ctx: None)
    fake.inject("POST", r"/worker/poll/$", 503,
                problem(503, "This server holds as many waiting polls as it may and nothing is ready on this "
                             "queue; poll again after Retry-After seconds.", "poll_capacity"),
                headers={"Retry-After": "1"})
    with running(worker):
        assert fake.wait_for(lambda: len(fake.calls_to("/worker/poll")) >= 2, timeout=5)
    first, second = fake.calls_to("/worker/poll")[:2]
    assert second.at - first.at >= 0.95  # not the backoff's 0.05 s
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO and "503" in r.getMessage()]
    assert len(said) == 1 and said[0][0] == logging.WARNING, said
    assert "503 poll_capacity" in said[0][1] and "polling again after 1.0 s" in said[0][1]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert worker.stats["polls_deferred"] == 1 and worker.stats["poll_failures"] == 0


def test_a_retry_after_is_waited_60_s_at_most_and_a_stop_ends_the_wait(
        fake: FakeFlowForge, make_worker: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="flowforge_sdk")
    worker = make_worker()
    worker.register("resize", lambda ctx: None)
    fake.inject("POST", r"/worker/poll/$", 429, headers={"Retry-After": "3600"})
    with running(worker) as runner:
        assert fake.wait_for(lambda: len(fake.calls_to("/worker/poll")) == 1)
        assert fake.wait_for(lambda: worker.stats["polls_deferred"] == 1)
        began = time.monotonic()
        worker.stop()
        assert runner.join(5)
        assert time.monotonic() - began < 2
    assert len(fake.calls_to("/worker/poll")) == 1
    assert any("429 throttled" in r.getMessage() and "polling again after 60.0 s" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


def test_log_lines_are_batched_and_sent_with_the_token_before_the_result(fake: FakeFlowForge,
                                                                        make_worker: Any) -> None:
    worker = make_worker(log_flush_interval_seconds=5.0)  # only full batches and the final flush

    @worker.task("resize")
    def resize(ctx: TaskContext) -> str:
        for i in range(250):
            ctx.log(f"line {i}", level="debug" if i % 2 else "info")
        ctx.log("x" * 5000, level="warning")
        return "done"

    task_id = fake.enqueue("images", "resize")
    with running(worker):
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "succeeded")

    calls = fake.calls_to(f"/worker/tasks/{task_id}/logs")
    assert all(len(c.body["lines"]) <= 100 and c.body["fencing_token"] == 1 for c in calls)
    assert len(calls) == 3  # 251 lines: 100 + 100 + 51
    lines = fake.task_runs[task_id].logs
    assert [line["message"] for line in lines[:250]] == [f"line {i}" for i in range(250)]
    assert [line["level"] for line in lines[:2]] == ["info", "debug"]
    assert lines[250]["level"] == "warning" and len(lines[250]["message"]) == 4000
    complete = fake.calls_to(f"/worker/tasks/{task_id}/complete")[0]
    assert all(c.at <= complete.at for c in calls)


def test_a_bad_log_level_raises_in_the_handler(fake: FakeFlowForge, make_worker: Any) -> None:
    worker = make_worker()

    @worker.task("resize")
    def resize(ctx: TaskContext) -> None:
        ctx.log("hello", level="verbose")

    task_id = fake.enqueue("images", "resize")
    with running(worker):
        assert fake.wait_for(lambda: fake.task_runs[task_id].state == "failed")
    assert fake.task_runs[task_id].error == ("ValueError: level must be one of debug, info, warning, error, "
                                             "got 'verbose'")


def test_a_member_key_makes_the_worker_stop_with_permission_denied(fake: FakeFlowForge, client: Client) -> None:
    worker = Worker(client, "images", poll_wait_seconds=0.2, handle_signals=False)
    worker.register("resize", lambda ctx: None)
    with pytest.raises(PermissionDenied) as caught:
        worker.run()
    assert caught.value.status == 403 and caught.value.code == "permission_denied"
    assert len(fake.calls_to("/worker/poll")) == 1  # not retried


def test_worker_settings_are_checked(worker_client: Client) -> None:
    with pytest.raises(ValueError, match="queue 'bad queue'"):
        Worker(worker_client, "bad queue")
    with pytest.raises(ValueError, match="concurrency must be from 1 to 100"):
        Worker(worker_client, "images", concurrency=0)
    worker = Worker(worker_client, "images")
    with pytest.raises(RuntimeError, match="no handler registered"):
        worker.run()
    worker.register("resize", lambda ctx: None)
    with pytest.raises(ValueError, match="registered already"):
        worker.register("resize", lambda ctx: None)
