"""The stall rule of gpu_worker/liveness.py on real kombu channels (in-memory transport).

The process-level reproduction (a real worker, a real redis-server killed mid-job) is in
tests/worker/test_worker_broker_loss.py; these pin the rule itself: a channel whose prefetch
window is full while Celery holds no request is stalled, and only that.
"""

from __future__ import annotations

from types import SimpleNamespace

from celery.worker import state as celery_state
from kombu import Connection, Consumer, Queue
from pydantic import SecretStr

from gpu_worker.liveness import ConsumerWatch, StallCounter, channel_may_consume
from gpu_worker.state import Phase, WorkerState


def test_a_stall_is_confirmed_only_after_consecutive_observations():
    counter = StallCounter(stall_checks=2)

    assert [counter.observe(s) for s in (True, False, True, True, True, False)] == [
        False,
        False,
        False,
        True,
        True,
        False,
    ]


def _delivered_message(connection: Connection):
    """One message delivered on a channel with a prefetch window of one, not acknowledged."""
    queue = Queue("liveness-test", channel=connection.default_channel)
    queue.declare()
    connection.default_channel.basic_publish(
        connection.default_channel.prepare_message("{}"), exchange="", routing_key=queue.name
    )
    channel = connection.channel()
    channel.basic_qos(0, 1, False)
    got = []
    consumer = Consumer(channel, [queue], callbacks=[lambda body, message: got.append(message)])
    consumer.consume()
    connection.drain_events(timeout=1)
    assert len(got) == 1 and consumer.channel is channel
    return channel, consumer, got[0]


def test_a_full_prefetch_window_with_no_request_held_is_a_stall():
    with Connection("memory://") as connection:
        channel, consumer, message = _delivered_message(connection)
        watch = ConsumerWatch(WorkerState())
        watch.attach(SimpleNamespace(task_consumer=consumer))

        assert channel_may_consume(channel) is False
        assert watch.stalled_now() is True  # what a lost acknowledgement leaves behind

        message.ack()
        assert channel_may_consume(channel) is True
        assert watch.stalled_now() is False


class HeldRequest:
    """Stands for a celery Request Celery holds (running, or waiting for its ETA)."""

    id = "task-held"
    name = "murmur.transcribe"
    eta = None
    expires = None


def test_a_message_celery_holds_is_not_a_stall():
    with Connection("memory://") as connection:
        _, consumer, _ = _delivered_message(connection)
        watch = ConsumerWatch(WorkerState())
        watch.attach(SimpleNamespace(task_consumer=consumer))
        held = HeldRequest()
        for hold in (celery_state.task_reserved, celery_state.task_scheduled):
            # Received and running, or a retried job waiting for its countdown.
            hold(held)
            try:
                assert watch.stalled_now() is False, hold.__name__
            finally:
                celery_state.task_ready(held)
            assert watch.stalled_now() is True


def test_no_consumer_yet_is_not_a_stall():
    watch = ConsumerWatch(WorkerState())
    assert watch.stalled_now() is False
    watch.attach(SimpleNamespace(task_consumer=None))
    assert watch.stalled_now() is False


def test_the_watch_thread_marks_the_state_and_clears_it():
    with Connection("memory://") as connection:
        _, consumer, message = _delivered_message(connection)
        state = WorkerState()
        state.set_phase(Phase.READY)
        watch = ConsumerWatch(state, interval_seconds=0.05, stall_checks=2)
        watch.attach(SimpleNamespace(task_consumer=consumer))
        watch.start()
        try:
            assert _eventually(lambda: not state.snapshot().consuming)
            message.ack()
            assert _eventually(lambda: state.snapshot().consuming)
        finally:
            watch.stop()


def _eventually(condition, seconds: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_no_heartbeat_is_sent_while_the_consumer_is_stalled(control_plane, cpu_env):
    from gpu_worker.client import ControlPlaneClient
    from gpu_worker.heartbeat import Heartbeat
    from gpu_worker.protocol.usage import REPORT_TIMEOUT

    client = ControlPlaneClient(
        control_plane.url,
        cpu_env["MURMUR_WORKER_ID"],
        cpu_env["MURMUR_INSTANCE_ID"],
        SecretStr(cpu_env["MURMUR_WORKER_TOKEN"]),
        timeout=REPORT_TIMEOUT,
    )
    state = WorkerState()
    heartbeat = Heartbeat(client, interval_seconds=30, state=state)

    assert heartbeat.beat() is True
    state.consumer_stalled()
    assert heartbeat.beat() is False
    assert control_plane.heartbeats == 1 and heartbeat.withheld == 1
    state.consumer_alive()
    assert heartbeat.beat() is True
    assert control_plane.heartbeats == 2
