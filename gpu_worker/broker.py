"""Where a profile's in-flight messages live on the broker (the acks_late wire contract).

kombu's Redis transport keeps each delivered, not yet acknowledged message in a hash, an index
by delivery time and a restore lock (`unacked`, `unacked_index`, `unacked_mutex` by default),
and any consumer using those keys pushes an entry older than the visibility timeout back to
whatever exchange and routing key the entry names. Shared by every consumer, they would let a
worker read other profiles' in-flight messages and forge entries that the control worker
would restore onto `control`. So the consumers of each `transcribe.<profile>` queue use keys
of their own, named after the queue; the control worker keeps kombu's defaults for `control`,
and a worker's broker user may touch only its profile's keys (app/fleet/broker_users.py).

Invariant: every consumer of a `transcribe.<profile>` queue uses `unacked_keys(queue)`, so a
message held by a worker that died is restored by the next consumer of the same queue (at its
start and every `unacked_restore_interval`) once it is older than the visibility timeout.
Producers need no option: kombu writes these keys only when it delivers a message.
"""

from __future__ import annotations


def unacked_keys(queue: str) -> dict[str, str]:
    """kombu Redis transport options naming `queue`'s own in-flight message keys."""
    return {
        "unacked_key": f"unacked.{queue}",
        "unacked_index_key": f"unacked_index.{queue}",
        "unacked_mutex_key": f"unacked_mutex.{queue}",
    }
