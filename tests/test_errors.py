"""One error model: domains refuse with a code (`Refused`), and app/errors.py alone maps a
code to an HTTP status (`STATUS`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.errors import RETRY_AFTER, STATUS, ApiError, Refused

ROOT = Path(__file__).resolve().parents[1]
# Modules of the domains and what they share: no HTTP status is written in them.
DOMAIN = [
    ROOT / "app/audio.py",
    ROOT / "app/urls.py",
    ROOT / "app/transitions.py",
    *sorted((ROOT / "app/jobs").glob("*.py")),
    *sorted((ROOT / "app/fleet").rglob("*.py")),
]
HTTP_LAYER = {"views.py", "cli.py"}


def _calls(path: Path, name: str) -> list[ast.Call]:
    tree = ast.parse(path.read_text())
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
    ]


def test_every_code_a_domain_refuses_with_has_its_status() -> None:
    codes = set()
    for path in ROOT.joinpath("app").rglob("*.py"):
        for call in _calls(path, "Refused"):
            first = call.args[0] if call.args else None
            assert isinstance(first, ast.Constant), f"{path}:{call.lineno}: a literal code"
            codes.add(first.value)
    assert codes, "no refusal found: the scan is broken"
    assert codes <= set(STATUS), codes - set(STATUS)
    assert set(STATUS) <= codes, f"statuses of codes nobody raises: {set(STATUS) - codes}"


def test_domains_raise_no_http_error() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{call.lineno}"
        for path in DOMAIN
        if path.name not in HTTP_LAYER
        for call in _calls(path, "ApiError")
    ]
    assert offenders == []


def test_a_refusal_answers_its_status_and_the_json_error_shape() -> None:
    from flask import Flask

    from app.errors import register_error_handlers

    flask_app = Flask(__name__)
    register_error_handlers(flask_app)

    @flask_app.get("/refuse/<code>")
    def refuse(code: str) -> str:
        raise Refused(code, f"refused: {code}", extra={"job_id": "job_1"})

    @flask_app.get("/busy")
    def busy() -> str:
        raise ApiError(503, "server_busy", "busy", headers={"Retry-After": "1"})

    client = flask_app.test_client()
    for code, status in STATUS.items():
        response = client.get(f"/refuse/{code}")
        assert response.status_code == status
        assert response.get_json() == {
            "error": {"code": code, "message": f"refused: {code}", "job_id": "job_1"}
        }
        assert response.headers.get("Retry-After") == (
            str(RETRY_AFTER[code]) if code in RETRY_AFTER else None
        )
    response = client.get("/busy")
    assert (response.status_code, response.headers["Retry-After"]) == (503, "1")
    assert response.get_json()["error"]["code"] == "server_busy"


def test_an_api_error_is_a_refusal_with_its_own_status() -> None:
    err = ApiError(415, "unsupported_media_type", "send multipart/form-data")
    assert isinstance(err, Refused) and err.status == 415
    with pytest.raises(KeyError):
        _ = Refused("no_such_code", "x").status
