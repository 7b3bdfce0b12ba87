"""The s3 audio store against a real S3 server over HTTP on loopback, through boto3.

moto's server (tests/s3_server.py) checks signatures and keys only in its strict mode, which
cannot serve presigned URLs: the pipeline runs on the open server, wrong credentials on the
strict one. Covers: upload (single PUT and multipart), the probe on the staged copy, a claim
handing out a presigned URL, the worker's fetch from another host, purge, retention, a bucket
that goes away (503 + Retry-After, nothing lost) and wrong credentials (validate-config,
`murmur api`).
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from click.testing import CliRunner
from pydantic import SecretStr
from sqlalchemy import update

from app.cli import main as murmur
from app.config import load_settings
from app.credentials import InstanceCredential
from app.db import Database
from app.errors import Refused
from app.jobs.retention import sweep_expired_audio
from app.migrate import upgrade
from app.models import Job, JobStatus, utcnow
from app.storage import S3AudioStore, open_store
from gpu_worker.client import ControlPlaneClient
from tests.conftest import (
    FIXTURES,
    SIGNING_KEY,
    LiveApi,
    add_worker,
    auth,
    make_settings,
    wait_for,
)
from tests.s3_server import S3Server, start_s3_server

SPEECH = (FIXTURES / "speech-short.wav").read_bytes()
TRANSCRIPT = {"text": "hello", "language": "en", "segments": []}


@pytest.fixture()
def database_url(tmp_path: Path) -> str:
    """SQLite only: the store, not the database, is under test here."""
    url = f"sqlite:///{tmp_path}/murmur.db"
    upgrade(url)
    return url


@pytest.fixture()
def live_api_env(s3_env: dict[str, str]) -> dict[str, str]:
    return s3_env


def _store(tmp_path: Path, env: dict[str, str], **extra: str) -> S3AudioStore:
    settings = load_settings(env={"MURMUR_STORAGE_PATH": str(tmp_path / "audio"), **env, **extra})
    store = open_store(settings)
    assert isinstance(store, S3AudioStore)
    return store


def _bucket(env: dict[str, str]) -> str:
    return env["MURMUR_S3_BUCKET"]


# --- the store ------------------------------------------------------------------------------


def test_small_and_multipart_uploads_arrive_whole_and_leave_nothing_staged(
    tmp_path: Path, s3_server: S3Server, s3_env: dict[str, str]
) -> None:
    store = _store(tmp_path, s3_env, MURMUR_S3_KEY_PREFIX="audio-")
    big = os.urandom(11 * 1024 * 1024 + 17)  # three parts of 5 MiB (the smallest S3 allows)
    for key, content in (("small.audio", SPEECH), ("big.audio", big)):
        staged = store.staging_path()
        staged.write_bytes(content)
        store.commit(staged, key)
        assert not staged.exists()
        assert store.size(key) == len(content)
        with store.open(key) as fh:
            assert fh.read() == content
    assert sorted(s3_server.keys(_bucket(s3_env))) == ["audio-big.audio", "audio-small.audio"]
    s3 = s3_server.client()
    assert s3.list_multipart_uploads(Bucket=_bucket(s3_env)).get("Uploads", []) == []
    assert list(store.staging.iterdir()) == []


def test_an_abandoned_multipart_upload_is_aborted_by_the_staging_sweep(
    tmp_path: Path, s3_server: S3Server, s3_env: dict[str, str]
) -> None:
    store = _store(tmp_path, s3_env)
    s3, bucket = s3_server.client(), _bucket(s3_env)
    # What a process killed mid-upload leaves: an unfinished multipart upload with a part.
    upload = s3.create_multipart_upload(Bucket=bucket, Key="crashed.audio")
    s3.upload_part(
        Bucket=bucket, Key="crashed.audio", UploadId=upload["UploadId"], PartNumber=1, Body=b"x"
    )
    assert len(s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])) == 1
    # (moto dates every upload's start in 2010, so "too young to abort" is not seen here.)
    assert store.remove_stale_staging(0) == 1
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert s3_server.keys(bucket) == []  # nothing half-written ever became an object


def test_a_multipart_upload_that_breaks_off_is_aborted_and_never_visible(
    tmp_path: Path, s3_server: S3Server, s3_env: dict[str, str]
) -> None:
    """The connection drops on every try of the second part (the client's own event hook,
    before the bytes leave): the upload is refused 503, and the parts already sent are
    discarded (the multipart upload is aborted), so no object and no upload is left."""
    from botocore.exceptions import EndpointConnectionError

    store = _store(tmp_path, s3_env)
    sent: list[str] = []

    def drop_second_part(request: Any, **_: Any) -> None:
        sent.append(request.url)
        if "partNumber=2" in request.url:
            raise EndpointConnectionError(endpoint_url=s3_env["MURMUR_S3_ENDPOINT_URL"])

    store.client.meta.events.register("before-send.s3.UploadPart", drop_second_part)
    staged = store.staging_path()
    staged.write_bytes(os.urandom(11 * 1024 * 1024))
    with pytest.raises(Refused) as err:
        store.commit(staged, "broken.audio")
    assert err.value.code == "storage_unavailable"
    assert any("partNumber=1" in url for url in sent)  # a part reached the server
    assert any("partNumber=2" in url for url in sent)
    assert not staged.exists()
    s3 = s3_server.client()
    assert s3.list_multipart_uploads(Bucket=_bucket(s3_env)).get("Uploads", []) == []
    assert s3_server.keys(_bucket(s3_env)) == []


def test_a_missing_object_is_audio_not_found_and_deleting_it_is_harmless(
    tmp_path: Path, s3_env: dict[str, str]
) -> None:
    store = _store(tmp_path, s3_env)
    with pytest.raises(Refused) as err:
        store.open("absent.audio")
    assert err.value.code == "audio_not_found"
    store.delete("absent.audio")


def test_the_presigned_url_reads_one_object_for_a_short_while(
    tmp_path: Path, s3_env: dict[str, str]
) -> None:
    store = _store(tmp_path, s3_env)
    staged = store.staging_path()
    staged.write_bytes(SPEECH)
    store.commit(staged, "a.audio")
    url = store.direct_url("a.audio", 120)
    assert url is not None
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    assert f"{parts.scheme}://{parts.netloc}" == s3_env["MURMUR_S3_ENDPOINT_URL"]
    assert parts.path == f"/{_bucket(s3_env)}/a.audio"
    assert query["X-Amz-Expires"] == ["120"]
    assert s3_env["MURMUR_S3_SECRET_ACCESS_KEY"] not in url
    response = requests.get(url, timeout=10)  # no credential of ours: the URL is enough
    assert response.status_code == 200 and response.content == SPEECH


# --- through the API: upload, claim, worker fetch, purge, retention -------------------------


def _upload(live: LiveApi) -> requests.Response:
    return requests.post(
        f"{live.url}/v1/jobs",
        files={"file": ("a.wav", SPEECH)},
        headers=auth(),
        timeout=30,
    )


def _job(db: Database, job_id: str) -> Job:
    with db.session() as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def test_upload_claim_worker_fetch_purge_on_the_s3_store(
    live_api: LiveApi, start_worker: Any, s3_server: S3Server, s3_env: dict[str, str]
) -> None:
    bucket = _bucket(s3_env)
    _, proc = start_worker()
    response = _upload(live_api)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    key = _job(live_api.db, job_id).audio_key
    assert key is not None and s3_server.keys(bucket) == [key]
    # Nothing stays on the API host's disk: the staged copy went up and was removed.
    assert [p for p in Path(live_api.settings.storage_path).rglob("*") if p.is_file()] == []

    def succeeded() -> bool:
        status = requests.get(f"{live_api.url}/v1/jobs/{job_id}", headers=auth(), timeout=10)
        return bool(status.json()["status"] == "succeeded")

    wait_for(succeeded, 120, "the job to succeed")
    # The worker read the audio from the bucket's host, not through the API's signed route.
    host = urlsplit(s3_env["MURMUR_S3_ENDPOINT_URL"]).netloc
    assert f"of audio from http://{host}/{bucket}/" in proc.output()
    assert "/internal/jobs/" not in proc.output()
    # Neither the store's secret nor the presigned URL's signature reaches the worker's log.
    assert s3_env["MURMUR_S3_SECRET_ACCESS_KEY"] not in proc.output()
    assert "X-Amz-Signature" not in proc.output()

    purged = requests.delete(
        f"{live_api.url}/v1/jobs/{job_id}?purge=true", headers=auth(), timeout=10
    )
    assert purged.status_code in (200, 204), purged.text
    assert s3_server.keys(bucket) == []


def test_retention_deletes_the_object_and_keeps_rows_when_the_bucket_is_gone(
    live_api: LiveApi, s3_server: S3Server, s3_env: dict[str, str]
) -> None:
    bucket = _bucket(s3_env)
    ids = [_upload(live_api).json()["id"] for _ in range(2)]
    with live_api.db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id.in_(ids))
            .values(status=JobStatus.SUCCEEDED.value, finished_at=utcnow() - timedelta(days=3))
        )
    store = open_store(live_api.settings)
    keys = sorted(s3_server.keys(bucket))
    assert len(keys) == 2
    # The bucket is gone: the sweep deletes nothing and forgets no key.
    s3_server.drop_bucket(bucket)
    assert sweep_expired_audio(live_api.db, store, live_api.settings, utcnow()) == 0
    assert all(_job(live_api.db, i).audio_key is not None for i in ids)
    s3_server.make_bucket(bucket)
    assert sweep_expired_audio(live_api.db, store, live_api.settings, utcnow()) == 2
    assert all(_job(live_api.db, i).audio_key is None for i in ids)


def test_a_bucket_that_goes_away_answers_503_and_loses_nothing(
    live_api: LiveApi, s3_server: S3Server, s3_env: dict[str, str], caplog: Any
) -> None:
    bucket = _bucket(s3_env)
    kept = _upload(live_api).json()["id"]
    with live_api.db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == kept)
            .values(status=JobStatus.CANCELLED.value, finished_at=utcnow())
        )
    saved = {
        k: s3_server.client().get_object(Bucket=bucket, Key=k)["Body"].read()
        for k in s3_server.keys(bucket)
    }
    s3_server.drop_bucket(bucket)

    refused = _upload(live_api)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "storage_unavailable"
    assert int(refused.headers["Retry-After"]) > 0
    assert s3_env["MURMUR_S3_SECRET_ACCESS_KEY"] not in refused.text
    # No job was created for it, and no staged copy stays behind on the API host.
    listed = requests.get(f"{live_api.url}/v1/jobs", headers=auth(), timeout=10).json()
    assert [j["id"] for j in listed["data"]] == [kept]
    assert [p for p in Path(live_api.settings.storage_path).rglob("*") if p.is_file()] == []
    # A purge meanwhile is refused the same way, and the job stays whole.
    purge = requests.delete(f"{live_api.url}/v1/jobs/{kept}?purge=true", headers=auth(), timeout=10)
    assert purge.status_code == 503 and purge.json()["error"]["code"] == "storage_unavailable"
    assert _job(live_api.db, kept).audio_key is not None
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "app.storage")
    assert "NoSuchBucket" in logged  # the operator is told why, without a credential
    for secret in (s3_env["MURMUR_S3_SECRET_ACCESS_KEY"], s3_env["MURMUR_S3_ACCESS_KEY_ID"]):
        assert secret not in logged

    # The bucket comes back (restored from its backup): the same requests now succeed.
    s3_server.make_bucket(bucket)
    for k, body in saved.items():
        s3_server.client().put_object(Bucket=bucket, Key=k, Body=body)
    assert _upload(live_api).status_code == 202
    purge = requests.delete(f"{live_api.url}/v1/jobs/{kept}?purge=true", headers=auth(), timeout=10)
    assert purge.status_code in (200, 204), purge.text


# --- the worker's fetch from another host ---------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).seen.append(dict(self.headers))
        self.send_response(200)
        self.send_header("Content-Length", str(len(SPEECH)))
        self.end_headers()
        self.wfile.write(SPEECH)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def other_host() -> Iterator[str]:
    """An HTTP server on another loopback address: the bucket's host, not the API's."""
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.2", 0), _Recorder)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield f"http://127.0.0.2:{server.server_address[1]}"
    server.shutdown()


def test_the_worker_fetches_from_another_host_without_its_credential(other_host: str) -> None:
    token = "instance-credential-" + "z" * 40
    client = ControlPlaneClient("http://127.0.0.1:9", "w1", "i1", SecretStr(token))
    url = f"{other_host}/murmur-audio/a.audio?X-Amz-Signature=abc&X-Amz-Expires=300"
    with client.download_audio(url) as fh:
        assert fh.read() == SPEECH
    (headers,) = _Recorder.seen
    assert not {k.lower() for k in headers} & {"authorization", "cookie", "x-amz-security-token"}
    assert all(token not in value for value in headers.values())


# --- wrong credentials: a clear error before any upload -------------------------------------


@pytest.fixture(scope="module")
def strict_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = start_s3_server(tmp_path_factory.mktemp("s3-strict") / "s3.log", strict=True)
    server.make_bucket()
    yield server
    server.stop()


def _validate(tmp_path: Path, env: dict[str, str]) -> Any:
    base = make_settings(f"sqlite:///{tmp_path}/m.db", "redis://127.0.0.1:9/0", tmp_path)
    full = {
        "MURMUR_API_TOKEN": base.api_tokens[0].get_secret_value(),
        "MURMUR_SIGNING_KEY": base.reveal("signing_key"),
        "MURMUR_STORAGE_PATH": str(tmp_path / "audio"),
        **env,
    }
    return CliRunner().invoke(murmur, ["validate-config"], env=full)


def test_validate_config_says_the_bucket_is_reachable_and_writable(
    tmp_path: Path, strict_s3: S3Server
) -> None:
    result = _validate(tmp_path, strict_s3.env())
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"MURMUR_S3_SECRET_ACCESS_KEY": "not-the-secret-" + "q" * 24},
            "secret access key does not match",
        ),
        ({"MURMUR_S3_ACCESS_KEY_ID": "AKIANOSUCHKEY0000000"}, "access key id is unknown"),
        ({"MURMUR_S3_BUCKET": "no-such-bucket"}, "not reachable: no such bucket"),
        ("readonly", "reachable but not writable"),
    ],
)
def test_validate_config_names_what_is_wrong_with_the_bucket(
    tmp_path: Path, strict_s3: S3Server, change: Any, expected: str
) -> None:
    if change == "readonly":
        key_id, secret = strict_s3.readonly
        change = {"MURMUR_S3_ACCESS_KEY_ID": key_id, "MURMUR_S3_SECRET_ACCESS_KEY": secret}
    env = {**strict_s3.env(), **change}
    result = _validate(tmp_path, env)
    assert result.exit_code == 1
    assert expected in result.output, result.output
    assert "bucket 'murmur-audio'" in result.output or "no-such-bucket" in result.output
    assert env["MURMUR_S3_SECRET_ACCESS_KEY"] not in result.output


def test_the_api_refuses_to_start_with_credentials_the_bucket_refuses(
    tmp_path: Path, strict_s3: S3Server
) -> None:
    env = {**strict_s3.env(), "MURMUR_S3_SECRET_ACCESS_KEY": "not-the-secret-" + "q" * 24}
    base = make_settings(f"sqlite:///{tmp_path}/m.db", "redis://127.0.0.1:9/0", tmp_path)
    env.update(
        MURMUR_API_TOKEN=base.api_tokens[0].get_secret_value(),
        MURMUR_SIGNING_KEY=base.reveal("signing_key"),
        MURMUR_STORAGE_PATH=str(tmp_path / "audio"),
    )
    result = CliRunner().invoke(murmur, ["api"], env=env)
    assert result.exit_code == 1
    assert "cannot start the API" in result.output
    assert "secret access key does not match" in result.output, result.output
    assert env["MURMUR_S3_SECRET_ACCESS_KEY"] not in result.output


def test_an_s3_store_without_credentials_or_bucket_is_a_config_problem(tmp_path: Path) -> None:
    result = _validate(tmp_path, {"MURMUR_STORAGE_BACKEND": "s3"})
    assert result.exit_code == 1
    for needed in ("storage.bucket", "MURMUR_S3_ACCESS_KEY_ID", "MURMUR_S3_SECRET_ACCESS_KEY"):
        assert needed in result.output


def test_s3_secrets_come_from_the_environment_or_files_only(tmp_path: Path) -> None:
    config = tmp_path / "murmur.toml"
    config.write_text('s3_secret_access_key = "x"\n[storage]\nbackend = "s3"\n')
    secret = tmp_path / "secret"
    secret.write_text("from-a-file-" + "f" * 30 + "\n")
    with pytest.raises(Exception, match="secrets come from the environment"):
        load_settings(config, env={})
    settings = load_settings(
        env={"MURMUR_S3_SECRET_ACCESS_KEY_FILE": str(secret), "MURMUR_STORAGE_BACKEND": "s3"}
    )
    assert settings.reveal("s3_secret_access_key") == "from-a-file-" + "f" * 30
    assert "from-a-file" not in repr(settings) and "from-a-file" not in repr(open_store(settings))


# --- why the s3 store exists: the local store past one host ---------------------------------


def test_a_local_store_claim_on_another_host_is_a_clear_audio_not_found(
    client: Any, db: Database, settings: Any
) -> None:
    """Host B (this app) answers a claim for audio host A stored on its own disk: the signed
    URL it issues finds no file, and says so (the two-host drill in bench/object_store.py)."""
    worker = add_worker(db)
    submitted = client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO(SPEECH), "a.wav")},
        headers=auth(),
        content_type="multipart/form-data",
    )
    job_id = submitted.get_json()["id"]
    for stored in Path(settings.storage_path).glob("*.audio"):
        stored.unlink()  # it is on host A's disk, not here
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token
    claimed = client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}/jobs/{job_id}/claim",
        json={},
        headers={"Authorization": f"Bearer {token}"},
    )
    url = urlsplit(claimed.get_json()["job"]["audio_url"])
    fetched = client.get(f"{url.path}?{url.query}")
    assert fetched.status_code == 404
    assert fetched.get_json()["error"]["code"] == "audio_not_found"


def test_a_url_jobs_audio_is_fetched_into_the_bucket(
    live_api: LiveApi, s3_server: S3Server, s3_env: dict[str, str], other_host: str
) -> None:
    """The URL fetch (the control worker's task body, run here in-process) stages, probes and
    stores the audio the same way; a bucket gone meanwhile leaves the job waiting for a retry."""
    from app.celery_config import make_celery
    from app.jobs.fetch import fetch_audio
    from app.jobs.io_slots import IoSlots, SlotsBusy
    from app.services import build_services

    svc = build_services(live_api.settings, make_celery(live_api.settings), db=live_api.db)
    slots = IoSlots(svc.redis, svc.settings.io)
    bucket = _bucket(s3_env)
    ids = []
    for _ in range(2):
        response = requests.post(
            f"{live_api.url}/v1/jobs",
            headers=auth(),
            json={"url": f"{other_host}/speech.wav"},
            timeout=10,
        )
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    fetch_audio(svc, slots, ids[0])
    key = _job(live_api.db, ids[0]).audio_key
    assert key is not None and s3_server.keys(bucket) == [key]
    with svc.storage.open(key) as fh:
        assert fh.read() == SPEECH
    s3_server.drop_bucket(bucket)
    with pytest.raises(SlotsBusy):  # the outage passes: the job waits, its task retries
        fetch_audio(svc, slots, ids[1])
    waiting = _job(live_api.db, ids[1])
    assert (waiting.status, waiting.audio_key) == ("queued", None)
    # Only the download, kept for the retry (app/jobs/fetch_spool.py): nothing staged.
    left = [p for p in Path(live_api.settings.storage_path).rglob("*") if p.is_file()]
    assert [(p.parent.name, p.name.partition("~")[0]) for p in left] == [(".fetched", ids[1])]
    s3_server.make_bucket(bucket)  # back: the retried fetch stores the audio once
    fetch_audio(svc, slots, ids[1])
    key = _job(live_api.db, ids[1]).audio_key
    assert key is not None and s3_server.keys(bucket) == [key]
    assert [p for p in Path(live_api.settings.storage_path).rglob("*") if p.is_file()] == []
