"""Dramatiq's Redis broker with consumers that are woken instead of left to poll.

Upstream's Redis consumer (``dramatiq.brokers.redis._RedisConsumer``) fetches by
polling: when a fetch finds its queue empty, or when it may not fetch because the
messages it already holds reach its prefetch, it sleeps an exponential back-off
(5 ms doubling up to the worker timeout, 1 s by default) before it looks again. So a
message enqueued while every consumer sleeps waits for the next poll (the first run
after an idle minute waited up to a second), and a process whose prefetch is taken up
by long messages leaves threads idle for up to that back-off after they finish.

``WakingRedisBroker`` keeps upstream's broker, scripts and queue layout, and its
back-off as the longest wait, but a consumer waits on an event instead of sleeping:

- every enqueue also PUBLISHes on the queue's wake channel (``wake_channel``); one
  listener thread per process (a Redis pub/sub subscription, started with the first
  consumer) sets the events of that queue's consumers, so an idle consumer fetches a
  new message at once;
- a consumer that held back because its prefetch was taken is woken when its process
  acks or nacks one of them: it fetches as soon as it has room, as upstream's would at
  its next poll (a message at the head of the queue, the scheduler's first lane, waits
  for the first free place, not for a poll).

- a message pushed to the *head* of a queue (``flowforge.broker.HEAD_OPTION``: the
  engine's first lane) is announced as such, with how many; a consumer held back by its
  prefetch, while more were announced than its fetches took, then fetches one message
  beyond it, which is that head (or, when another process took it first, the next
  message: one more than its prefetch until an ack; never more than one beyond it,
  however many head messages come), for the process's reserved thread
  (``flowforge.dramatiq_middleware.LaneWorkQueue``). Without it, the head
  waited until one of the messages the consumer held ended, which with messages carrying
  several generations of a slow task was a whole message (240 ms against an idle 14 ms
  in ``tests/integration/test_scheduling.py``'s fairness scenario).

- a consumer's acks are written behind (``AckWriter``): ``ack`` queues the message's ack
  and returns, and one thread of the process sends every queued ack in one pipeline (one
  round trip for all the acks of the process's threads meanwhile). A worker thread no
  longer waits a broker round trip after each message (a fifth of an engine worker
  thread's time under make bench's independent no-op tasks, py-spy), and Redis runs the
  acks of a round trip together. An ack not yet sent when the process dies is a message
  the process fetched and did not ack: given back by ``flowforge.broker_recovery`` and
  refused by the start's fencing check, as one the process died running.

A lost notification (the listener reconnecting, a message enqueued by a client that
does not publish) costs what upstream always costs: the next poll. Selected by
``flowforge.broker.build_broker`` for redis:// URLs; RabbitMQ's consumer is pushed
to already.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable

import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

log = logging.getLogger(__name__)

# Seconds the listener waits before subscribing again after its connection failed.
LISTENER_RETRY_SECONDS = 0.5
# The payload of a wake-up for a message pushed to the head of its queue ("head:N" for N).
HEAD_PAYLOAD = b"head"


def head_payload(n: int) -> bytes:
    """A wake-up's payload: b"" for messages at the tail only, HEAD_PAYLOAD for one pushed
    to the head, b"head:N" for N of them."""
    return b"" if n <= 0 else HEAD_PAYLOAD if n == 1 else HEAD_PAYLOAD + b":%d" % n


def head_count(data) -> int:
    """The messages pushed to the head that a wake-up's payload (bytes or str) announces:
    0 for anything not made by head_payload."""
    if isinstance(data, str):
        data = data.encode()
    if data == HEAD_PAYLOAD:
        return 1
    prefix = HEAD_PAYLOAD + b":"
    if isinstance(data, bytes) and data.startswith(prefix) and data[len(prefix):].isdigit():
        return int(data[len(prefix):])
    return 0


def wake_channel(namespace: str, queue_name: str) -> str:
    """The pub/sub channel that announces messages on ``queue_name`` (delay queues,
    ``<name>.DQ``, have their own)."""
    return f"{namespace}:wake:{queue_name}"


class AckWriter:
    """A process's acks, written behind (module docstring): ``submit`` queues one and
    returns; a thread of its own (started with the first) sends all queued in one
    pipeline of upstream's ``dispatch`` script's "ack" command, one round trip per turn.
    A turn that fails puts its acks back in front of the queue and is tried again,
    RETRY_SECONDS doubling up to MAX_RETRY_SECONDS (an ack sent twice is a no-op: the
    script removes the id only if it is still in the consumer's ack set); its warning is
    logged once per LOG_EVERY_SECONDS at most. ``flush`` sends what is queued in the
    caller's thread (a consumer's close); ``stop`` ends the thread (the broker's close)."""

    #: Seconds before the first try again of a turn that failed; doubled up to MAX_RETRY_SECONDS.
    RETRY_SECONDS = 0.2
    MAX_RETRY_SECONDS = 5.0
    #: A broker down for long logs one warning per this many seconds, not one per try.
    LOG_EVERY_SECONDS = 30.0

    def __init__(self, broker: RedisBroker):
        self._broker = broker
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str]] = []  # (queue name, redis message id)
        self._in_flight = 0  # acks of the pipeline being sent
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        # Held while a turn sends: a flush waits for the turn in flight, then sends the rest.
        self._sending = threading.Lock()
        self._last_warning = float("-inf")

    def submit(self, queue_name: str, redis_message_id: str) -> None:
        """Queue the ack of ``redis_message_id`` on ``queue_name`` (returns at once)."""
        with self._lock:
            self._pending.append((queue_name, redis_message_id))
            if not self._stopping and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._loop, name="flowforge-broker-acks", daemon=True)
                self._thread.start()
        self._wake.set()

    def flush(self) -> None:
        """Send every queued ack now, in this thread. Raises what the send raised
        (redis.ConnectionError when the broker cannot be reached): the acks stay queued."""
        with self._sending:
            self._send_pending()

    def stop(self) -> None:
        """End the writer's thread after its turn in flight; what is still queued is not sent."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)

    def pending(self) -> int:
        """How many acks were submitted and not sent yet (queued, or in a pipeline the
        server has not answered)."""
        with self._lock:
            return len(self._pending) + self._in_flight

    def _loop(self) -> None:
        delay = self.RETRY_SECONDS
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                with self._sending:
                    self._send_pending()
                delay = self.RETRY_SECONDS
            except Exception as exc:  # noqa: BLE001 - the acks are back in the queue; the thread must go on
                now = time.monotonic()
                if now - self._last_warning >= self.LOG_EVERY_SECONDS:
                    self._last_warning = now
                    log.warning("could not send %d acks to the broker (%s: %s); trying again every %g s at most",
                                self.pending(), type(exc).__name__, exc, self.MAX_RETRY_SECONDS)
                time.sleep(delay)
                delay = min(delay * 2, self.MAX_RETRY_SECONDS)
                self._wake.set()

    def _send_pending(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            self._in_flight = len(batch)
        try:
            if batch and self._send(batch):
                # NOSCRIPT: the server restarted or flushed its scripts since the broker
                # loaded them; loaded again, the acks it refused are sent once more.
                dispatch = self._broker.scripts["dispatch"]
                try:
                    dispatch.sha = self._broker.client.script_load(dispatch.script)
                except redis.ResponseError as exc:
                    # Not a passing fault (SCRIPT LOAD refused: an ACL): retrying would hold
                    # every later ack behind these; they stay in the ack set, given back by
                    # broker_recovery once the process is gone and refused by fencing.
                    log.warning("the broker refused to load the ack script (%s); %d acks dropped", exc, len(batch))
                    return
                if self._send(batch):
                    log.warning("the broker refused %d acks: it knows no script %s even after loading it",
                                len(batch), dispatch.sha)
        except BaseException:
            with self._lock:  # sent again by the next turn, before what came meanwhile
                self._pending[:0] = batch
            raise
        finally:
            with self._lock:
                self._in_flight = 0

    def _send(self, batch: list[tuple[str, str]]) -> bool:
        """Send ``batch``'s acks in one pipeline; True when the server knew no such script
        (nothing was acked). Raises what the pipeline raised (a lost connection)."""
        broker = self._broker
        dispatch = broker.scripts["dispatch"]
        # Bare EVALSHAs: a redis-py pipeline holding Script calls first asks the server
        # whether the scripts exist (SCRIPT EXISTS, a round trip of its own) on every execute.
        pipe = broker.client.pipeline(transaction=False)
        now = int(time.time() * 1000)
        for queue_name, message_id in batch:
            pipe.evalsha(dispatch.sha, 1, broker.namespace, "ack", now, queue_name, broker.broker_id,
                         broker.heartbeat_timeout, broker.dead_message_ttl, 0, broker._max_unpack_size(), message_id)
        replies = pipe.execute(raise_on_error=False)
        errors = [reply for reply in replies if isinstance(reply, Exception)]
        if any(isinstance(reply, redis.exceptions.NoScriptError) for reply in errors):
            return True
        if errors:  # left in the ack set: given back by broker_recovery once the process is gone (as upstream)
            log.warning("%d of %d acks were refused by the broker: %s", len(errors), len(batch), errors[0])
        return False


class WakingRedisBroker(RedisBroker):
    """``RedisBroker`` whose consumers wait on an event that enqueues and acks set
    (module docstring). Same constructor arguments as ``RedisBroker``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._events_lock = threading.Lock()
        # queue name -> this process's consumers of it (their wake events are set, and they
        # are told of messages pushed to its head)
        self._consumers: dict[str, set[WakingConsumer]] = {}
        self._listener: threading.Thread | None = None
        self.acks = AckWriter(self)

    def close(self) -> None:
        """Stop the ack writer's thread (after its turn in flight; the consumers' close
        sent what was queued), then upstream's close."""
        self.acks.stop()
        super().close()

    @property
    def consumer_class(self):
        return WakingConsumer

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> WakingConsumer:
        """A consumer of ``queue_name`` (as upstream's), registered for its wake-ups."""
        consumer = WakingConsumer(self, queue_name, prefetch, timeout)
        with self._events_lock:
            self._consumers.setdefault(queue_name, set()).add(consumer)
            if self._listener is None or not self._listener.is_alive():
                self._listener = threading.Thread(target=self._listen, name="flowforge-broker-wakeup", daemon=True)
                self._listener.start()
        return consumer

    def forget(self, consumer: WakingConsumer) -> None:
        """Stop waking ``consumer`` (it was closed)."""
        with self._events_lock:
            self._consumers.get(consumer.queue_name, set()).discard(consumer)

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        """Upstream's enqueue, then a notification on the queue's wake channel (the
        delay queue's when ``delay`` is given). A failed notification is logged, not
        raised: the message is enqueued and the consumers' next poll finds it."""
        message = super().enqueue(message, delay=delay)
        self.notify([message.queue_name])
        return message

    def notify(self, queue_names: Iterable[str], pipeline=None, *, head: Iterable[str] = ()) -> None:
        """PUBLISH once on the wake channel of each queue in ``queue_names``: in
        ``pipeline`` when given (the caller executes it), else now. ``head`` names a queue
        once per message pushed to its head: its notification says so, and how many
        (``head_payload``)."""
        target = pipeline if pipeline is not None else self.client.pipeline(transaction=False)
        heads = Counter(head)
        for name in dict.fromkeys(queue_names):
            target.publish(wake_channel(self.namespace, name), head_payload(heads[name]))
        if pipeline is None:
            try:
                target.execute()
            except redis.RedisError as exc:
                log.warning("could not publish a wake-up for %s (consumers find it at their next poll): %s",
                            ", ".join(queue_names), exc)

    def wake(self, queue_name: str, *, head: int = 0) -> None:
        """Set the events of this process's consumers of ``queue_name``; when ``head``
        messages were pushed to its head, first tell them so: one held back by its
        prefetch fetches one message beyond it."""
        with self._events_lock:
            consumers = list(self._consumers.get(queue_name, ()))
        if head:
            for consumer in consumers:
                consumer.count_head(head)
        for consumer in consumers:
            consumer.wake_event.set()

    def _listen(self) -> None:
        """The listener thread: one pattern subscription to this namespace's wake
        channels; each notification wakes that queue's consumers. Resubscribes after a
        lost connection, and wakes every consumer then (a notification may have been
        missed meanwhile)."""
        prefix = wake_channel(self.namespace, "")
        while True:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.psubscribe(prefix + "*")
                self._wake_all()
                while True:
                    item = pubsub.get_message(timeout=1.0)
                    if item is None:
                        continue
                    channel = item["channel"]
                    channel = channel.decode() if isinstance(channel, bytes) else channel
                    self.wake(channel[len(prefix):], head=head_count(item.get("data")))
            except Exception as exc:  # noqa: BLE001 - the listener must outlive a lost connection
                log.warning("broker wake-up listener lost its connection (%s); resubscribing", exc)
                time.sleep(LISTENER_RETRY_SECONDS)
            finally:
                try:
                    pubsub.close()
                except Exception:  # noqa: BLE001 - closing a broken connection
                    pass

    def _wake_all(self) -> None:
        with self._events_lock:
            consumers = [c for consumers in self._consumers.values() for c in consumers]
        for consumer in consumers:
            consumer.wake_event.set()


class WakingConsumer(_RedisConsumer):
    """Upstream's Redis consumer whose back-off is a wait on ``wake_event``: set by the
    broker's listener when a message is enqueued on this queue, and by this consumer's
    own acks and nacks when it was held back by its prefetch."""

    def __init__(self, broker: WakingRedisBroker, queue_name: str, prefetch: int, timeout: int):
        super().__init__(broker, queue_name, prefetch, timeout)
        self.wake_event = threading.Event()
        # True while the consumer waits because its prefetch is taken (acks wake it then).
        self._held_back = False
        # Messages pushed to the queue's head since this consumer's fetches took as many
        # (counted by the broker's listener, count_head): while some are, a consumer held
        # back by its prefetch fetches one message beyond it. A count, not a flag: two head
        # messages announced together, of which one normal fetch took one, leave one for
        # the process's reserved thread (flowforge.dramatiq_middleware.LaneWorkQueue).
        self.head_pending = 0
        self._head_lock = threading.Lock()
        # The etas (epoch ms) of the delayed messages this consumer handed out, which its
        # worker's consumer thread holds until they are due and enqueues only when this
        # consumer's iteration comes back: a wait never lasts past the earliest, or a
        # scheduler nudge for a rate window's next half came up to a back-off late (a
        # review saw second halves claimed 0.4 to 0.5 s after their half point).
        self._etas: list[float] = []

    def ack(self, message: MessageProxy) -> None:
        """Queue the message's ack (``AckWriter``: sent by the process's ack thread) and
        make room for the next fetch."""
        try:
            # On the queue consumed (a delayed message is acked where it was fetched from).
            self.broker.acks.submit(self.queue_name, message.options["redis_message_id"])
        finally:
            self.queued_message_ids.discard(message.message_id)
            self._wake_if_room()

    def nack(self, message: MessageProxy) -> None:
        try:
            super().nack(message)
        finally:
            self._wake_if_room()

    def _wake_if_room(self) -> None:
        if self._held_back and (self.outstanding_message_count < self.prefetch or self._may_fetch_head()):
            self.wake_event.set()

    def count_head(self, n: int = 1) -> None:
        """``n`` more messages were pushed to the queue's head (the listener's notification)."""
        with self._head_lock:
            self.head_pending += n

    def _fetched(self, n: int) -> None:
        """A fetch took ``n`` messages from the front of the queue, where head messages
        are: that many fewer head messages may wait, and none when it found the queue
        empty (another process may have taken some unseen: then a fetch beyond the
        prefetch takes the next message, one at most)."""
        with self._head_lock:
            self.head_pending = max(0, self.head_pending - n) if n else 0

    def _may_fetch_head(self) -> bool:
        """A message was pushed to the head that no fetch of this consumer took, and this
        consumer holds no more than its prefetch: it may fetch one beyond it. Never two: a
        storm of head messages (many organizations' first lanes) cannot make one process
        hoard the queue; the next waits for an ack."""
        return self.head_pending > 0 and self.outstanding_message_count <= self.prefetch

    def _until_next_eta(self, backoff_ms: float) -> float:
        """``backoff_ms``, cut to the milliseconds until the earliest eta this consumer
        handed out (1 ms once it is due: one more turn for the consumer thread, which
        enqueues it then; the eta is forgotten after that turn)."""
        if not self._etas:
            return backoff_ms
        due_ms = self._etas[0] - time.time() * 1000
        if due_ms <= 0:
            heapq.heappop(self._etas)
            return 1
        return min(backoff_ms, due_ms + 1)

    def close(self) -> None:
        self.broker.forget(self)
        try:
            self.broker.acks.flush()
        except redis.RedisError as exc:  # given back by broker_recovery, refused by fencing
            log.warning("could not send this process's last acks (%s): their messages are redelivered", exc)
        super().close()

    def __next__(self):
        # Upstream's __next__ (dramatiq/brokers/redis.py, _RedisConsumer) with its
        # time.sleep(backoff) made a wait on wake_event.
        try:
            while True:
                try:
                    data = self.message_cache.pop(0)
                    if data is None:
                        continue
                    self.misses = 0
                    message = Message.decode(data)
                    self.queued_message_ids.add(message.message_id)
                    eta = message.options.get("eta")
                    if isinstance(eta, int | float):
                        heapq.heappush(self._etas, float(eta))
                    return MessageProxy(message)
                except IndexError:
                    messages = []
                    held_back = self.outstanding_message_count >= self.prefetch
                    if not held_back:
                        self.message_cache = messages = self.broker.do_fetch(
                            self.queue_name,
                            self.prefetch - self.outstanding_message_count,
                        )
                        self._fetched(len(messages))
                    elif self._may_fetch_head():
                        # One beyond the prefetch: a message pushed to the head.
                        self.message_cache = messages = self.broker.do_fetch(self.queue_name, 1)
                        self._fetched(1)
                    if not messages:
                        self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
                        backoff_ms = self._until_next_eta(backoff_ms)
                        self._held_back = held_back
                        # Checked again after publishing the flag: an ack in between has
                        # seen it unset and could not wake this wait.
                        if held_back:
                            self._wake_if_room()
                        self.wake_event.wait(backoff_ms / 1000)
                        self.wake_event.clear()
                        self._held_back = False
                        return None
        except redis.ConnectionError as e:
            raise ConnectionClosed(e) from None
