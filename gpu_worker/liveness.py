"""Consumer liveness: notice a Celery consumer that has stopped taking messages, and recover.

Why it is needed (docs/reliability.md, "Redis stopped (data lost) and restarted"): when the
broker goes away while a job runs, acknowledging that job fails. kombu's Redis transport
(`QoS.ack`) first removes the message from Redis's in-flight indices and only then marks it
acknowledged in the channel; the first step raising skips the second, and Celery's
`Request.acknowledge` (`Message.ack_log_error`) logs `Couldn't ack …` and swallows the
connection error. The channel therefore still counts the message as delivered and not
acknowledged, so with a prefetch window of one `QoS.can_consume()` stays False for good: the
transport never sends another BRPOP, the event loop polls no broker socket, so no connection
error ever reaches Celery's consumer, which would have reconnected. The process looks healthy
(its usage reports and even Celery's own worker-heartbeat events go on) and consumes nothing.

The stall, as observed here: the task channel may not consume (`channel.qos.can_consume()` is
False) while Celery holds no request at all (nothing reserved, nothing running), i.e. the
prefetch window is held by messages nobody works on. Seen `STALL_CHECKS` times in a row, one
`CHECK_INTERVAL_SECONDS` apart, it is confirmed. Two watchers act on it:

- a thread (`ConsumerWatch`) marks the worker state stalled, and healthy again once the
  consumer can take a message; while marked, the usage reporter and the bare heartbeat send
  nothing (gpu_worker/state.py `StateSnapshot.consuming`). It is a thread because the event
  loop itself may be blocked meanwhile: with the broker still down, Celery's worker-heartbeat
  event publish retries its connection inside the loop.
- a consumer bootstep (`consumer_liveness_step`) checks from the consumer's own event loop and
  raises `ConsumerStalled` there, a connection error to Celery (kombu's Redis transport counts
  every OSError as one): Celery's consumer then does what it does on any connection loss,
  closes the connection and its channels (dropping their bookkeeping), reconnects with retry
  and consumes again.

Invariants:
- A worker that cannot take a job is never reported live and idle; if the reconnect does not
  bring it back, the fleet's silence rule declares it dead and replaces it (docs/fleet.md,
  `no heartbeat`). A consumer that is merely reconnecting (an ordinary broker outage, no lost
  acknowledgement) holds no prefetch slot and is not judged stalled.
- A running job is never taken for a stall (Celery holds its request), and the loop check runs
  only between messages (the solo pool runs a job inside the loop).
- The watchers only read Celery's and kombu's state; nothing here acknowledges, rejects or
  restores a message: a message whose ack was lost is redelivered by the broker's own rules,
  and a job runs safely twice (gpu_worker/jobs.py).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps
from celery.worker import state as celery_state

from gpu_worker.state import WorkerState

log = logging.getLogger(__name__)

CHECK_INTERVAL_SECONDS = 1.0
# Consecutive stalled checks before recovering: the condition is stable once reached, one more
# check costs a second and rules out a state caught half-way.
STALL_CHECKS = 2


class ConsumerStalled(ConnectionError):
    """The consumer holds its whole prefetch window for messages no request is working on."""


def channel_may_consume(channel: Any) -> bool:
    """Whether the kombu channel's prefetch window lets it take another message.

    Virtual transports (Redis among them) keep that count in `channel.qos`; a transport without
    one (AMQP: the broker enforces prefetch) is never judged stalled here.
    """
    can_consume = getattr(getattr(channel, "qos", None), "can_consume", None)
    return not callable(can_consume) or bool(can_consume())


def celery_holds_requests() -> bool:
    """Whether Celery holds any task request not yet finished: reserved, running, or waiting
    for its ETA (a retried job's countdown holds its message in this process meanwhile)."""
    return any(
        len(held)
        for held in (
            celery_state.reserved_requests,
            celery_state.active_requests,
            celery_state.scheduled_requests,
        )
    )


class StallCounter:
    """Confirms a stall after `stall_checks` stalled observations in a row."""

    def __init__(self, stall_checks: int = STALL_CHECKS) -> None:
        self._stall_checks = stall_checks
        self._seen = 0

    def observe(self, stalled: bool) -> bool:
        """Record one observation; True while the stall is confirmed."""
        self._seen = self._seen + 1 if stalled else 0
        return self._seen >= self._stall_checks


class ConsumerWatch:
    """Keeps `state` marked stalled while the attached Celery consumer is; runs on a thread."""

    def __init__(
        self,
        state: WorkerState,
        interval_seconds: float = CHECK_INTERVAL_SECONDS,
        stall_checks: int = STALL_CHECKS,
    ) -> None:
        self._state = state
        self._interval = interval_seconds
        self._stall_checks = stall_checks
        self._consumer: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, consumer: Any) -> None:
        """The Celery consumer (celery.worker.consumer.Consumer) to watch."""
        self._consumer = consumer

    def stalled_now(self) -> bool:
        """One observation: the task channel may not consume and Celery holds no request."""
        task_consumer = getattr(self._consumer, "task_consumer", None)
        if task_consumer is None:  # not consuming yet
            return False
        return not channel_may_consume(task_consumer.channel) and not celery_holds_requests()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="consumer-watch", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        counter = StallCounter(self._stall_checks)
        stalled = False
        while not self._stop.wait(self._interval):
            try:
                confirmed = counter.observe(self.stalled_now())
            except Exception as exc:  # a read racing a reconnect; the next one decides
                log.debug("consumer watch: %s", type(exc).__name__)
                continue
            if confirmed and not stalled:
                log.error(
                    "the consumer takes no message: its prefetch window is held by a message "
                    "no task holds (an acknowledgement lost with the broker connection); "
                    "reports withheld until it consumes again"
                )
                self._state.consumer_stalled()
            elif stalled and not confirmed:
                log.info("the consumer can take messages again")
                self._state.consumer_alive()
            stalled = confirmed


def consumer_liveness_step(watch: ConsumerWatch) -> type[Any]:
    """A consumer bootstep class bound to `watch`; add it with `app.steps["consumer"].add`."""

    class ConsumerLiveness(bootsteps.StartStopStep):  # type: ignore[misc]
        """Attaches `watch`, and restarts a stalled consumer from its own event loop."""

        requires = ("celery.worker.consumer.tasks:Tasks",)

        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, **kwargs)
            self._entry: Any = None
            self._counter = StallCounter()

        def start(self, parent: Any) -> None:
            watch.attach(parent)
            watch.start()
            if parent.hub is None:  # no event loop (not the Redis transport): no restart
                log.warning("a stalled consumer is not restarted: the worker has no event loop")
                return
            self._cancel()
            self._counter = StallCounter()  # a new connection starts with a clean count
            self._entry = parent.hub.call_repeatedly(CHECK_INTERVAL_SECONDS, self._check)

        def stop(self, parent: Any) -> None:
            self._cancel()

        def shutdown(self, parent: Any) -> None:
            self._cancel()
            watch.stop()

        def _cancel(self) -> None:
            if self._entry is not None:
                self._entry.cancel()
                self._entry = None

        def _check(self) -> None:
            if self._counter.observe(watch.stalled_now()):
                log.error("the consumer is stalled: reconnecting to the broker")
                raise ConsumerStalled("consumer stalled: prefetch window held, no task running")

    return ConsumerLiveness
