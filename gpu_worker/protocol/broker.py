"""What travels through Redis: the task name, queue names and the shared visibility timeout.

Invariants:
- A transcribe message is the task `TRANSCRIBE_TASK` with positional args `[job_id]` only.
- A profile's queue is `queue_name(profile)`, and only that function builds one; a profile
  name matches `PROFILE_NAME_PATTERN`, so a queue name is never ambiguous or empty.
- Every consumer of the shared broker uses `VISIBILITY_TIMEOUT_SECONDS`: on one Redis the
  shortest visibility timeout wins, and a job running longer than it is delivered again.
- Every consumer of a `transcribe.<profile>` queue keeps its in-flight messages under
  `unacked_keys(queue)`, and a worker's broker user may touch only those keys of its profile
  (app/fleet/broker_users.py grants them): see "In-flight messages" below.

In-flight messages (the acks_late wire contract): kombu's Redis transport keeps each
delivered, not yet acknowledged message in a hash, an index by delivery time and a restore
lock (`unacked`, `unacked_index`, `unacked_mutex` by default), and any consumer using those
keys pushes an entry older than the visibility timeout back to whatever exchange and routing
key the entry names. Shared by every consumer, they would let a worker read other profiles'
in-flight messages and forge entries that the control worker would restore onto `control`.
So the consumers of each `transcribe.<profile>` queue use keys of their own, named after the
queue; the control worker keeps kombu's defaults for `control`. A message held by a worker
that died is restored by the next consumer of the same queue (at its start and every
`unacked_restore_interval`) once it is older than the visibility timeout. Producers need no
option: kombu writes these keys only when it delivers a message.
"""

from __future__ import annotations

import re

TRANSCRIBE_TASK = "murmur.transcribe"
QUEUE_PREFIX = "transcribe."

# Lowercase letters, digits and '-', at most 40: a profile name is a queue name's suffix, a
# metric label and part of a Redis ACL key pattern.
PROFILE_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"
PROFILE_NAME = re.compile(PROFILE_NAME_PATTERN)

# Longer than any job can take: kombu re-delivers an unacked message after this many seconds.
VISIBILITY_TIMEOUT_SECONDS = 4 * 3600


def queue_name(profile: str) -> str:
    """The queue a profile's workers consume: `transcribe.<profile>`."""
    return f"{QUEUE_PREFIX}{profile}"


def profile_of_queue(queue: str) -> str:
    """The profile a transcribe queue belongs to (the inverse of `queue_name`)."""
    return queue.removeprefix(QUEUE_PREFIX)


def unacked_keys(queue: str) -> dict[str, str]:
    """kombu Redis transport options naming `queue`'s own in-flight message keys."""
    return {
        "unacked_key": f"unacked.{queue}",
        "unacked_index_key": f"unacked_index.{queue}",
        "unacked_mutex_key": f"unacked_mutex.{queue}",
    }
