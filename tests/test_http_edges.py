"""Every error a client can see is {"error": {"code", "message"}}: gunicorn's own and Flask's.

The gunicorn cases run the production command line (app/server.py) on loopback.
"""

from __future__ import annotations

import io
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import API_TOKEN, auth, make_settings
from tests.serving import Gunicorn, gunicorn_api


def _error(response: requests.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Gunicorn]:
    with gunicorn_api(tmp_path_factory.mktemp("edges"), redis_url) as api:
        yield api


def _raw(server: Gunicorn, request: bytes) -> bytes:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_huge_header_is_431_json_without_echo(server: Gunicorn) -> None:
    secret = "s3cr3t" * 2000
    response = requests.get(f"{server.url}/healthz", headers={"X-Big": secret}, timeout=10)
    _error(response, 431, "request_header_fields_too_large")
    assert "s3cr3t" not in response.text


def test_too_many_headers_is_431_json(server: Gunicorn) -> None:
    headers = {f"X-H{i}": "x" for i in range(150)}
    response = requests.get(f"{server.url}/healthz", headers=headers, timeout=10)
    _error(response, 431, "request_header_fields_too_large")


def test_long_uri_is_414_json_without_echo(server: Gunicorn) -> None:
    response = requests.get(f"{server.url}/v1/jobs?sig=" + "q" * 9000, timeout=10)
    _error(response, 414, "uri_too_long")
    assert "qqqq" not in response.text


def test_garbage_request_line_is_400_json(server: Gunicorn) -> None:
    answer = _raw(server, b"NOT HTTP AT ALL\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert b"Content-Type: application/json" in head
    assert b'"code": "bad_request"' in body
    assert b"NOT HTTP" not in body


def test_options_is_204_with_allow_and_no_html(server: Gunicorn) -> None:
    response = requests.options(f"{server.url}/v1/jobs", timeout=10)
    assert response.status_code == 204
    assert {"GET", "POST"} <= {m.strip() for m in response.headers["Allow"].split(",")}
    assert "html" not in response.headers.get("Content-Type", "")
    assert response.content == b""


def test_options_on_unknown_path_is_404_json(server: Gunicorn) -> None:
    _error(requests.options(f"{server.url}/nowhere", timeout=10), 404, "not_found")


def test_too_many_form_parts_is_413_naming_the_form_limit(server: Gunicorn) -> None:
    fields = [(f"f{i}", (None, "x")) for i in range(1100)]
    response = requests.post(f"{server.url}/v1/jobs", headers=auth(), files=fields, timeout=30)
    error = _error(response, 413, "form_too_large")
    assert "1000 parts" in error["message"]
    assert "body is larger" not in error["message"]


def test_flask_errors_are_json(tmp_path: Path, redis_url: str) -> None:
    from app import create_app
    from app.db import Database
    from app.migrate import upgrade

    url = f"sqlite:///{tmp_path}/murmur.db"
    upgrade(url)
    settings = make_settings(url, redis_url, tmp_path, MURMUR_MAX_UPLOAD_BYTES="100000")
    db = Database(url)
    try:
        client = create_app(settings, db=db).test_client()

        def check(response: Any, status: int, code: str) -> Any:
            assert response.status_code == status, response.data
            assert response.is_json, response.headers
            assert response.get_json()["error"]["code"] == code
            return response

        check(client.get("/nowhere"), 404, "not_found")
        put = check(client.put("/v1/jobs", headers=auth()), 405, "method_not_allowed")
        assert "POST" in put.headers["Allow"]
        big = check(
            client.post(
                "/v1/jobs",
                headers=auth(),
                data={"file": (io.BytesIO(b"\0" * 300_000), "a.wav")},
                content_type="multipart/form-data",
            ),
            413,
            "payload_too_large",
        )
        assert "body is larger" in big.get_json()["error"]["message"]
        # The answer names the setting that raises the limit.
        assert "api.max_upload_bytes, MURMUR_MAX_UPLOAD_BYTES" in big.get_json()["error"]["message"]
        many = client.post(
            "/v1/jobs",
            headers=auth(),
            data={f"f{i}": "x" for i in range(1100)},
            content_type="multipart/form-data",
        )
        check(many, 413, "form_too_large")
        options = client.options("/v1/jobs/abc")
        assert options.status_code == 204 and options.data == b""
        assert "html" not in options.headers.get("Content-Type", "")
    finally:
        db.dispose()


def _chunked(server: Gunicorn, path: str, content_type: str, body: bytes) -> tuple[int, Any]:
    """POST `body` as it is after a chunked head; (status, parsed JSON body)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Authorization: Bearer {API_TOKEN}\r\nContent-Type: {content_type}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head_bytes, _, rest = answer.partition(b"\r\n\r\n")
    status = int(head_bytes.split(b" ", 2)[1])
    assert b"application/json" in head_bytes, answer
    return status, json.loads(rest.split(b"\r\n\r\n")[0])


_PART = b'--zz\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF'
_MALFORMED_CHUNKED = {
    "bad size, json": ("application/json", b"zz\r\n{}\r\n0\r\n\r\n"),
    "bad size, form": (
        "multipart/form-data; boundary=zz",
        b"%x\r\n" % len(_PART) + _PART + b"\r\nqq\r\n",
    ),
    "no terminator": ("multipart/form-data; boundary=zz", b"%x\r\n" % len(_PART) + _PART + b"XX"),
    "truncated": ("multipart/form-data; boundary=zz", b"40\r\n" + _PART[:20]),
}


# The sync endpoint refuses a JSON body before reading it, so it gets only the form cases.
_CHUNKED_CASES = [("/v1/jobs", case) for case in _MALFORMED_CHUNKED] + [
    ("/v1/audio/transcriptions", case)
    for case, (content_type, _) in _MALFORMED_CHUNKED.items()
    if content_type != "application/json"
]


@pytest.mark.parametrize(("path", "case"), _CHUNKED_CASES)
def test_malformed_chunked_body_is_400_json(server: Gunicorn, path: str, case: str) -> None:
    content_type, body = _MALFORMED_CHUNKED[case]
    status, answer = _chunked(server, path, content_type, body)
    assert status == 400, answer
    assert answer["error"]["code"] in {"invalid_body", "bad_request"}, answer


def test_chunked_form_with_too_many_parts_names_the_form_limit(server: Gunicorn) -> None:
    parts = b"".join(
        b'--zz\r\nContent-Disposition: form-data; name="p%d"\r\n\r\nx\r\n' % i for i in range(1200)
    )
    body = parts + b"--zz--\r\n"
    status, answer = _chunked(
        server,
        "/v1/jobs",
        "multipart/form-data; boundary=zz",
        b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n",
    )
    assert status == 413, answer
    assert answer["error"]["code"] == "form_too_large", answer
    assert "body is larger" not in answer["error"]["message"]


def test_doubled_slashes_are_404_json_not_an_html_redirect(server: Gunicorn) -> None:
    response = requests.get(
        f"{server.url}//v1//jobs", headers=auth(), timeout=10, allow_redirects=False
    )
    _error(response, 404, "not_found")


def test_gunicorn_error_log_never_holds_request_text(server: Gunicorn) -> None:
    """A malformed request or header line can carry a signature or a token; the server's log
    (gunicorn's own warnings included) keeps only the exception class."""
    token = API_TOKEN.encode()
    sig = b"SECRETSIG"
    cases = [
        b"GET  /v1/audio/job_x?sig=" + sig + b"1 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/audio/job_x?sig=" + sig + b"2 HTTP/1.1 extra\r\nHost: x\r\n\r\n",
        b"GET /v1/audio/job_x?sig=" + sig + b"3\tHTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization Bearer " + token + b"-NOCOLON\r\n\r\n",
        b"GET /v1/audio/job_x?sig=" + sig + b"4\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    for case in cases:
        assert _raw(server, case).startswith(b"HTTP/1.1 400 ")
    log = ""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # gunicorn writes its log asynchronously
        log = server.proc.output()
        if log.count("Invalid request from ip=") >= len(cases):
            break
        time.sleep(0.1)
    assert log.count("Invalid request from ip=") >= len(cases), log
    assert "SECRETSIG" not in log
    assert API_TOKEN not in log
    assert "InvalidRequestLine" in log


def _worker_pid(server: Gunicorn) -> int:
    """The pid of the one gunicorn worker process (a child of the arbiter)."""
    arbiter = server.proc.popen.pid
    children = Path(f"/proc/{arbiter}/task/{arbiter}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_json_body_over_64_kib_is_413_whatever_its_content(server: Gunicorn) -> None:
    body = {"url": "http://127.0.0.1:9/" + "a" * 70_000}
    response = requests.post(f"{server.url}/v1/jobs", headers=auth(), json=body, timeout=10)
    _error(response, 413, "payload_too_large")


def test_chunked_json_body_is_refused_without_reading_it_whole(server: Gunicorn) -> None:
    """20 MB of `[{},{},…]` sent chunked: refused at the JSON limit, not parsed into objects
    (which took ~1.3 GB for a 26 MB body)."""
    pid = _worker_pid(server)
    before = _peak_rss_kib(pid)
    piece = b"[" + b"{}," * 300_000
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Authorization: Bearer {API_TOKEN}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    host, port = server.url.removeprefix("http://").split(":")
    answer = b""
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)
        try:
            for _ in range(22):  # about 20 MB, bounded
                sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
                piece = b"{}," * 300_000
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed before the end: what is wanted
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b'"payload_too_large"' in answer
    grown_mib = (_peak_rss_kib(pid) - before) / 1024
    assert grown_mib < 15, f"peak RSS grew {grown_mib:.0f} MiB for a refused JSON body"


@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_an_upload_refused_before_its_body_is_read_gets_its_answer_whole(
    server: Gunicorn, token: str | None
) -> None:
    """An 8 MB upload refused on its token is answered 401 JSON, then closed cleanly: the body
    is read and dropped first. Closing on unread data resets the connection, and a client that
    reads its answer after the reset (as the TLS front did) lost it."""
    body = b"\0" * 8_000_000
    head = (
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + (f"Authorization: Bearer {token}\r\n" if token else "")
        + "Content-Type: multipart/form-data; boundary=x\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 * 1024)
        sock.sendall(head + body)  # a reset here, or below, is the failure
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 401 "), answer[:200]
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "unauthorized"


def test_a_body_declared_over_the_limit_is_refused_without_being_read(server: Gunicorn) -> None:
    """No drain for a body the limit refuses: the connection closes after the 413 instead of
    reading the 100 MB the head announced."""
    head = (
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {API_TOKEN}\r\nContent-Type: multipart/form-data; boundary=x\r\n"
        f"Content-Length: {100 * 1024 * 1024}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    answer = _raw(server, head + b"\0" * 4096)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert time.monotonic() - started < 5
