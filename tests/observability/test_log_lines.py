"""A worker's log line is cleaned by one rule (gpu_worker/protocol/redaction.py) on both sides.

The worker and the control plane used to keep their own copies of the redaction patterns,
and they had drifted: only the control plane turned U+2028/U+2029 into spaces, so a worker
line could reach an admin's screen as two lines. Both paths now run `clean_log_line`; the
control plane's path is tested through the report endpoint in test_diagnostics.py.
"""

from __future__ import annotations

import logging

from gpu_worker.protocol.redaction import MAX_LOG_LINE, clean_log_line
from gpu_worker.telemetry import render_record

# Every character `str.splitlines` breaks a line on.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def log_record(message: str) -> logging.LogRecord:
    return logging.LogRecord("gpu_worker.jobs", logging.INFO, __file__, 1, message, (), None)


def test_the_worker_sends_one_line_whatever_the_message_holds() -> None:
    sent = render_record(log_record("job_1 done" + "".join(f"{c}x" for c in LINE_BREAKS)))
    assert len(sent.splitlines()) == 1 and not set(sent) & set(LINE_BREAKS)


def test_a_control_character_hides_no_secret() -> None:
    # Replaced before the patterns run, a NUL would cut a URL in two and leave its second
    # half; after them, it would keep a token out of reach of `Bearer\s+`. Both passes run.
    line = clean_log_line("GET http://host/a\x00/b?sig=123 Bearer\x00tok3n token=\x01hunter2")
    for secret in ("/b", "sig=123", "tok3n", "hunter2"):
        assert secret not in line
    assert line == "GET <url> Bearer <secret> token=<secret>"


def test_a_bare_scheme_is_no_credential() -> None:
    # `\S+`: something must follow `://` for there to be anything to hide.
    assert clean_log_line("scheme http:// is refused") == "scheme http:// is refused"
    assert clean_log_line("at s3://bucket/key now") == "at <url> now"


def test_a_line_is_bounded_and_secrets_given_are_removed() -> None:
    line = clean_log_line("k=" + "x" * 1000 + " my-secret-value", ["my-secret-value"])
    assert len(line) == MAX_LOG_LINE and line.endswith("…")
    assert "my-secret-value" not in clean_log_line("a my-secret-value b", ["my-secret-value"])
