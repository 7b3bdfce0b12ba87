"""The control-plane client against a real HTTP server: auth, paths, errors, retries, audio."""

from __future__ import annotations

import logging

import pytest
from pydantic import SecretStr

from gpu_worker.client import (
    AudioDownloadError,
    AudioTooLarge,
    ControlPlaneClient,
    ControlPlaneError,
    ControlPlaneUnavailable,
    RuntimeMismatch,
    redact_url,
)
from gpu_worker.protocol import routes
from gpu_worker.protocol.readiness import ReadinessRuntime
from gpu_worker.protocol.transcript import Transcript

TOKEN = "ab" * 32
SILENCE = Transcript(text="", segments=[])


def client_for(plane, *, sleeps=None, token=TOKEN, attempts=4):
    return ControlPlaneClient(
        plane.url,
        "wrk_test1",
        "local-0001",
        SecretStr(token),
        timeout=(2.0, 5.0),
        attempts=attempts,
        sleep=(sleeps.append if sleeps is not None else lambda _: None),
    )


def test_ready_posts_the_runtime_with_the_bearer_token(control_plane):
    client_for(control_plane).ready(ReadinessRuntime(model="tiny.en"))

    method, path, headers = control_plane.requests[-1]
    assert (method, path) == ("POST", "/internal/workers/wrk_test1/local-0001/ready")
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert control_plane.ready_bodies == [{"runtime": {"model": "tiny.en"}}]


def test_runtime_mismatch_is_its_own_error(control_plane):
    control_plane.ready_status = 409

    with pytest.raises(RuntimeMismatch, match="409 runtime_mismatch: compute_type"):
        client_for(control_plane).ready(ReadinessRuntime())


def test_claim_returns_the_job_then_none_when_not_claimable(control_plane):
    control_plane.add_job("job_1", b"RIFF", language="en", word_timestamps=True, prompt="hi")
    client = client_for(control_plane)

    job = client.claim("job_1")
    again = client.claim("job_1")

    assert job is not None
    assert (job.id, job.language, job.word_timestamps, job.prompt) == ("job_1", "en", True, "hi")
    assert again is None


def test_job_ids_cannot_escape_the_path(control_plane):
    with pytest.raises(ControlPlaneError):
        client_for(control_plane).claim("../ready")

    _, path, _ = control_plane.requests[-1]
    assert path == "/internal/workers/wrk_test1/local-0001/jobs/..%2Fready/claim"


def test_result_is_stored_once(control_plane):
    control_plane.add_job("job_1", b"")
    client = client_for(control_plane)
    client.claim("job_1")

    first = client.post_result("job_1", Transcript(text="hi", segments=[]), 1.5)
    second = client.post_result("job_1", Transcript(text="hi", segments=[]), 1.5)

    assert (first, second) == (True, False)
    assert control_plane.results["job_1"] == {
        "transcript": {"text": "hi", "segments": []},
        "processing_seconds": 1.5,
    }


def test_failure_is_posted_with_code_and_message(control_plane):
    control_plane.add_job("job_1", b"")

    assert client_for(control_plane).post_failure("job_1", "audio_decode_failed", "bad") is True
    assert control_plane.failures["job_1"] == {"code": "audio_decode_failed", "message": "bad"}


def test_a_long_failure_message_is_cut_to_what_the_control_plane_accepts(control_plane):
    control_plane.add_job("job_1", b"")

    client_for(control_plane).post_failure("job_1", "transcription_failed", "x" * 5000)

    assert len(control_plane.failures["job_1"]["message"]) == 2000


def test_transient_errors_are_retried_with_backoff(control_plane):
    control_plane.add_job("job_1", b"")
    control_plane.scripted["/result"] = [503, 502]
    sleeps: list[float] = []

    stored = client_for(control_plane, sleeps=sleeps).post_result("job_1", SILENCE, 0.1)

    assert stored is True
    assert sleeps == [1.0, 2.0]


def test_retries_are_bounded(control_plane):
    control_plane.add_job("job_1", b"")
    control_plane.scripted["/failure"] = [503, 503, 503]

    with pytest.raises(ControlPlaneUnavailable, match="503"):
        client_for(control_plane, attempts=3).post_failure("job_1", "x", "y")


def test_claim_is_not_retried_by_the_client(control_plane):
    control_plane.add_job("job_1", b"")
    control_plane.scripted["/claim"] = [503]

    with pytest.raises(ControlPlaneUnavailable):
        client_for(control_plane).claim("job_1")
    assert len(control_plane.requests) == 1


def test_a_client_error_is_not_retried(control_plane):
    with pytest.raises(ControlPlaneError) as caught:
        client_for(control_plane, token="cd" * 32).post_failure("job_1", "x", "y")

    assert caught.value.status == 401
    assert not isinstance(caught.value, ControlPlaneUnavailable)
    assert len(control_plane.requests) == 1


def test_an_unreachable_control_plane_is_transient_and_hides_the_url(caplog):
    client = ControlPlaneClient(
        "http://127.0.0.1:9", "w", "i", SecretStr(TOKEN), attempts=2, sleep=lambda _: None
    )

    with caplog.at_level(logging.DEBUG), pytest.raises(ControlPlaneUnavailable) as caught:
        client.post_result("job_1", SILENCE, 0.0)

    assert str(caught.value) == (
        "POST /jobs/job_1/result: no answer from the control plane (ConnectionError)"
    )
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert TOKEN not in caplog.text


def test_audio_is_downloaded_without_the_bearer_token(control_plane):
    control_plane.add_job("job_1", b"x" * 5000)
    client = client_for(control_plane)
    job = client.claim("job_1")

    with client.download_audio(job.audio_url) as audio:
        assert audio.read() == b"x" * 5000

    method, path, headers = control_plane.requests[-1]
    assert method == "GET" and path.startswith("/audio/job_1?")
    assert "Authorization" not in headers


def test_relative_audio_urls_resolve_against_the_control_plane(control_plane):
    control_plane.add_job("job_1", b"abc")

    with client_for(control_plane).download_audio("/audio/job_1?sig=x") as audio:
        assert audio.read() == b"abc"


def test_audio_over_the_cap_is_refused_by_content_length(control_plane):
    control_plane.add_job("job_1", b"x" * 5000)

    with pytest.raises(AudioTooLarge, match="audio is 5000 bytes, the limit is 4096"):
        client_for(control_plane).download_audio("/audio/job_1?sig=x", max_bytes=4096)


def test_audio_over_the_cap_is_refused_while_streaming(control_plane):
    control_plane.add_job("job_1", b"x" * 5000, chunked=True)

    with pytest.raises(AudioTooLarge, match="exceeds the limit of 4096 bytes"):
        client_for(control_plane).download_audio("/audio/job_1?sig=x", max_bytes=4096)


def test_a_failed_download_names_the_url_without_its_signature(control_plane, caplog):
    with caplog.at_level(logging.DEBUG), pytest.raises(AudioDownloadError) as caught:
        client_for(control_plane).download_audio("/audio/nope?expires=1&sig=s3cr3tsig")

    assert str(caught.value) == f"GET {control_plane.url}/audio/nope answered 404"
    assert "s3cr3tsig" not in caplog.text


def test_routes_fill_each_id_as_one_path_segment():
    assert routes.worker_prefix("w/1", "i 2") == "/internal/workers/w%2F1/i%202"
    assert routes.job_route(routes.RESULT, "../x") == "/jobs/..%2Fx/result"
    assert routes.audio_path("job_1") == "/internal/audio/job_1"
    assert routes.flask_rule(routes.WORKER_PREFIX, routes.CLAIM) == (
        "/workers/<worker_id>/<instance_id>/jobs/<job_id>/claim"
    )


def test_redact_url_drops_query_and_credentials():
    assert redact_url("https://u:p@host:8443/a/b?sig=x#f") == "https://host:8443/a/b"
