"""`/docs`: the interactive page (Swagger UI) for the OpenAPI document at `/openapi.json`.

Invariants:
- Public like `/openapi.json`: the page and its assets hold nothing secret; a request the page
  sends ("Try it out") needs an API token like any other (the Authorize button).
- Everything the page loads comes from this API: Swagger UI's files ship in a pinned PyPI
  package (`flask-swagger-ui`, requirements/control.txt; only its files are used), so an
  offline deployment has a working page. No CDN, no call to Swagger's online validator.
- Only the files the page names are served (`ASSETS`), by name: no path from the request
  reaches the file system.
- The page runs no inline script: its start-up is `/docs/assets/murmur-docs.js`, and the
  Content-Security-Policy allows scripts from this origin only.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from flask import Blueprint, Response, send_from_directory

from app.errors import ApiError

docs_bp = Blueprint("docs", __name__)

ASSET_PREFIX = "/docs/assets/"
# The files the page loads, and their media types.
ASSETS = {
    "swagger-ui.css": "text/css",
    "index.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui-standalone-preset.js": "text/javascript",
    "favicon-32x32.png": "image/png",
    "favicon-16x16.png": "image/png",
}
START_SCRIPT = "murmur-docs.js"
# Swagger UI sets inline styles and loads its SVG icons as data: URLs.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# Cached for an hour: the files change only with the package's pin.
_MAX_AGE = 3600

_PAGE = f"""<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="UTF-8">
  <title>Murmur API</title>
  <link rel="stylesheet" type="text/css" href="{ASSET_PREFIX}index.css">
  <link rel="stylesheet" type="text/css" href="{ASSET_PREFIX}swagger-ui.css">
  <link rel="icon" type="image/png" href="{ASSET_PREFIX}favicon-32x32.png" sizes="32x32">
  <link rel="icon" type="image/png" href="{ASSET_PREFIX}favicon-16x16.png" sizes="16x16">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{ASSET_PREFIX}swagger-ui-bundle.js"></script>
  <script src="{ASSET_PREFIX}swagger-ui-standalone-preset.js"></script>
  <script src="{ASSET_PREFIX}{START_SCRIPT}"></script>
</body>
</html>
"""

# validatorUrl null: Swagger UI would otherwise send the document to validator.swagger.io.
_START = """window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    plugins: [SwaggerUIBundle.plugins.DownloadUrl],
    layout: "StandaloneLayout"
  });
});
"""


def asset_dir() -> Path:
    """Where the pinned package keeps Swagger UI's files."""
    spec = importlib.util.find_spec("flask_swagger_ui")
    if spec is None or spec.origin is None:
        raise RuntimeError("flask-swagger-ui is not installed (requirements/control.txt)")
    return Path(spec.origin).parent / "dist"


def _headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@docs_bp.get("/docs")
def docs_page() -> Response:
    return _headers(Response(_PAGE, content_type="text/html; charset=utf-8"))


@docs_bp.get(f"{ASSET_PREFIX}<name>")
def docs_asset(name: str) -> Response:
    if name == START_SCRIPT:
        response = Response(_START, content_type="text/javascript; charset=utf-8")
        response.cache_control.max_age = _MAX_AGE
        return _headers(response)
    media_type = ASSETS.get(name)
    if media_type is None:
        raise ApiError(404, "not_found", "no such file")
    response = send_from_directory(asset_dir(), name, mimetype=media_type, max_age=_MAX_AGE)
    return _headers(response)
