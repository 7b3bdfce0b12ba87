"""What travels through Redis: the task name, queue names and the shared visibility timeout.

Invariants:
- A transcribe message is the task `TRANSCRIBE_TASK` with positional args `[job_id]` only.
- A profile's queue is `queue_name(profile)`, and only that function builds one; a profile
  name matches `PROFILE_NAME_PATTERN`, so a queue name is never ambiguous or empty.
- Every consumer of the shared broker uses `VISIBILITY_TIMEOUT_SECONDS`: on one Redis the
  shortest visibility timeout wins, and a job running longer than it is delivered again.
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
