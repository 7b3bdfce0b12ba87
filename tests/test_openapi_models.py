"""/openapi.json and the request models (app/jobs/requests.py) describe the same inputs.

Three ways they could drift, each held here: a documented query parameter or body field that
no model field validates (or a model field the document leaves out); a documented schema
(type, enum, limits, default, required, extra fields) other than the model's own; and a
model that refuses what its documented schema allows, or takes what it rules out. The last is
probed from the document alone: its enums, bounds and lengths, fed to the models.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from schemathesis.specs.openapi.definitions import OPENAPI_30_VALIDATOR

from app.errors import Refused
from app.jobs import requests
from app.openapi import BODY_MODELS, QUERY_MODELS, _fields, openapi_document

DOC = openapi_document()
_METHODS = {"get", "put", "post", "delete", "patch"}
_JSON = "application/json"
# A URL job needs its url; resolving it is the URL checks' business, not this test's.
_REQUIRED = {"url": "https://example.com/a.wav"}


KNOWN = requests.Deployment(
    default_language=None, english_only=False, webhooks=True, resolve=lambda value, _: value
)


def _operations() -> Iterator[tuple[str, str, dict[str, Any], list[dict[str, Any]]]]:
    for path, item in DOC["paths"].items():
        for method, operation in item.items():
            if method in _METHODS:
                parameters = [*item.get("parameters", []), *operation.get("parameters", [])]
                yield path, method, operation, parameters


def _query(parameters: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in parameters if p["in"] == "query"}


def test_the_document_is_valid_openapi_3_0() -> None:
    OPENAPI_30_VALIDATOR.validate(DOC)
    assert DOC["openapi"] == "3.0.3"


def test_every_documented_input_is_a_model_field_and_back() -> None:
    seen_queries, seen_bodies = set(), set()
    for path, method, operation, parameters in _operations():
        query = _query(parameters)
        if query or (path, method) in QUERY_MODELS:
            model = QUERY_MODELS[(path, method)]
            assert set(query) == set(_fields(model)[0]), (path, method)
            seen_queries.add((path, method))
        for media_type, content in operation.get("requestBody", {}).get("content", {}).items():
            model = BODY_MODELS[(path, method, media_type)]
            documented = set(content["schema"]["properties"])
            if media_type == "multipart/form-data":
                part = getattr(model, "upload_part", requests.UPLOAD_PART)
                assert part in documented
                documented.discard(part)
            assert documented == set(_fields(model)[0]), (path, method, media_type)
            seen_bodies.add((path, method, media_type))
    assert seen_queries == set(QUERY_MODELS)
    assert seen_bodies == set(BODY_MODELS)


def test_every_documented_schema_is_its_models() -> None:
    for (path, method), model in QUERY_MODELS.items():
        properties, required, _ = _fields(model)
        parameters = _query(
            [
                *DOC["paths"][path].get("parameters", []),
                *DOC["paths"][path][method].get("parameters", []),
            ]
        )
        for name, schema in properties.items():
            documented = parameters[name]
            assert documented.get("required", False) == (name in required), name
            described = {
                **documented["schema"],
                **(
                    {"description": documented["description"]}
                    if "description" in documented
                    else {}
                ),
            }
            assert described == schema, (path, method, name)
    for (path, method, media_type), model in BODY_MODELS.items():
        properties, required, closed = _fields(model)
        body = DOC["paths"][path][method]["requestBody"]
        assert body["required"] is True
        schema = body["content"][media_type]["schema"]
        assert schema.get("additionalProperties", True) is not closed, (path, media_type)
        documented = dict(schema["properties"])
        needed = set(schema.get("required", []))
        if media_type == "multipart/form-data":
            part = getattr(model, "upload_part", requests.UPLOAD_PART)
            assert documented.pop(part) == {"type": "string", "format": "binary"}
            needed.discard(part)
        assert documented == properties, (path, media_type)
        assert needed == set(required), (path, media_type)


_CONSTRAINTS = ("type", "enum", "minimum", "maximum", "minLength", "maxLength", "format", "default")


def _pydantic_constraints(model: type[BaseModel], name: str) -> dict[str, Any]:
    """The constraints pydantic states for a field, read without app/openapi.py's converter."""
    schema = model.model_json_schema()
    flat = dict(schema["properties"][name])
    for variant in flat.pop("anyOf", []):
        if variant != {"type": "null"}:
            flat = {**variant, **flat}
    if "$ref" in flat:
        flat = {**schema["$defs"][flat.pop("$ref").rsplit("/", 1)[-1]], **flat}
    return {key: flat[key] for key in _CONSTRAINTS if flat.get(key) is not None}


def test_the_documented_constraints_are_pydantics() -> None:
    """Against a converter that would lose a limit or an enum on the way to the document."""
    for _, model, _, name, schema in CASES:
        stated = _pydantic_constraints(model, name)
        assert {key: schema[key] for key in stated if key in schema} == stated, (model, name)


# -- the models hold what the document promises -------------------------------------------


def _cases() -> Iterator[tuple[str, type[BaseModel], str, str, dict[str, Any]]]:
    """(where, model, how values travel, field name, documented schema) for every input."""
    for (path, method), model in QUERY_MODELS.items():
        item = DOC["paths"][path]
        for name, parameter in _query(
            [*item.get("parameters", []), *item[method].get("parameters", [])]
        ).items():
            yield f"{method} {path}", model, "text", name, parameter["schema"]
    for (path, method, media_type), model in BODY_MODELS.items():
        schema = DOC["paths"][path][method]["requestBody"]["content"][media_type]["schema"]
        for name, field in schema["properties"].items():
            if name != getattr(model, "upload_part", requests.UPLOAD_PART):
                travel = "json" if media_type == _JSON else "form"
                yield f"{method} {path} {media_type}", model, travel, name, field


CASES = list(_cases())


def _sent(value: Any, travel: str) -> Any:
    """`value` as a client sends it: JSON keeps its type, a form or query sends text."""
    if travel == "json":
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return [_sent(item, travel) for item in value]
    return str(value)


def _parse(model: type[BaseModel], travel: str, fields: dict[str, Any]) -> BaseModel:
    data = {**{k: v for k, v in _REQUIRED.items() if k in model.model_fields}, **fields}
    if travel == "form":
        form = {k: v if isinstance(v, list) else [v] for k, v in data.items()}
        data = requests.form_values(model, form)
    return requests.parse(model, data, KNOWN)


def _value(model: BaseModel, name: str) -> Any:
    for field_name, field in type(model).model_fields.items():
        if (field.alias or field_name) == name:
            return getattr(model, field_name)
    raise KeyError(name)


def _valid(schema: dict[str, Any]) -> list[Any]:
    kind = schema.get("type")
    if "enum" in schema:
        return list(schema["enum"])
    if kind == "array":
        return [[item] for item in _valid(schema["items"])] + [[]]
    if kind == "boolean":
        return [True, False]
    if kind == "integer":
        return [schema.get("minimum", 0), schema.get("maximum", 10**6)]
    if kind == "number":
        return [schema.get("minimum", 0.0), schema.get("maximum", 1e6)]
    if schema.get("format") == "uri":
        return ["https://example.com/a.wav"]
    return ["a" * schema.get("maxLength", 8)]


def _invalid(schema: dict[str, Any]) -> list[Any]:
    kind = schema.get("type")
    if "enum" in schema:
        return ["not-one-of-them"]
    if kind == "array":
        return [[item] for item in _invalid(schema["items"])]
    if kind == "boolean":
        return ["maybe"]
    if kind in ("integer", "number"):
        out: list[Any] = ["twelve"]
        out += [schema["minimum"] - 1] if "minimum" in schema else []
        out += [schema["maximum"] + 1] if "maximum" in schema else []
        return out
    return ["a" * (schema["maxLength"] + 1)] if "maxLength" in schema else []


@pytest.mark.parametrize(("where", "model", "travel", "name", "schema"), CASES)
def test_a_model_takes_what_its_document_allows(
    where: str, model: type[BaseModel], travel: str, name: str, schema: dict[str, Any]
) -> None:
    for value in _valid(schema):
        parsed = _parse(model, travel, {name: _sent(value, travel)})
        if "enum" in schema or schema.get("type") in ("boolean", "integer", "number"):
            assert _value(parsed, name) == value, (where, name, value)
    if "default" in schema:
        assert _value(_parse(model, travel, {}), name) == schema["default"], (where, name)


@pytest.mark.parametrize(("where", "model", "travel", "name", "schema"), CASES)
def test_a_model_refuses_what_its_document_rules_out(
    where: str, model: type[BaseModel], travel: str, name: str, schema: dict[str, Any]
) -> None:
    for value in _invalid(schema):
        with pytest.raises(Refused) as refused:
            _parse(model, travel, {name: _sent(value, travel)})
        assert refused.value.status == 400, (where, name, value)
        assert refused.value.message, (where, name, value)
