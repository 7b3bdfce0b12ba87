"""`create_app(settings)`: builds the Flask API with its services and blueprints."""

from __future__ import annotations

import logging

from celery import Celery
from flask import Flask, Response
from gunicorn.errors import AppImportError

from app.broker import redis_client
from app.config import (
    Settings,
    StartupRefused,
    check_settings,
    load_settings,
    scrape_token_problem,
)
from app.db import Database
from app.errors import register_error_handlers
from app.inputs import check_request_text
from app.jobs.event_hub import EventHub
from app.jobs.live import EVENT_HUB, STREAM_SLOTS
from app.jobs.stream_limits import StreamSlots
from app.jobs.waiting import SYNC_SLOTS, SyncSlots
from app.json_provider import FiniteJSONProvider
from app.server import read_refused_body
from app.services import Clock, build_services, utc_clock

log = logging.getLogger(__name__)

# Room for multipart framing and form fields around a file of the maximum size.
_MULTIPART_OVERHEAD = 64 * 1024


class ApiStartupRefused(StartupRefused, AppImportError):  # type: ignore[misc]
    """The API's refusal to start. As an `AppImportError`, gunicorn prints only its message
    and stops (exit 4) instead of logging a traceback and booting workers again."""


class ApiCannotStart(AppImportError):  # type: ignore[misc]
    """The API's refusal to start on a database it cannot serve on (see `ApiStartupRefused`
    for why an `AppImportError`)."""


class _Api(Flask):
    def make_default_options_response(self) -> Response:
        """OPTIONS: 204 with the Allow header and no body (Flask would send empty HTML)."""
        allow = super().make_default_options_response().headers["Allow"]
        response = Response(status=204, headers={"Allow": allow})
        del response.headers["Content-Type"]  # no body, so no type
        return response


def create_app(
    settings: Settings | None = None,
    *,
    db: Database | None = None,
    celery: Celery | None = None,
    clock: Clock = utc_clock,
) -> Flask:
    own_start = False
    if settings is None:
        # A process's own start (`gunicorn 'app:create_app()'`, `murmur api`): it refuses the
        # configuration `murmur validate-config --role api` refuses, before serving anything.
        # A caller that passes its settings (tests, tools) has chosen them.
        own_start = True
        settings = load_settings()
        problems = check_settings(settings, role="api")
        if problems:
            raise ApiStartupRefused("API", problems, "api")
    app = _Api("murmur", static_folder=None)
    # `//v1//jobs` is 404 JSON, not Werkzeug's HTML 308 redirect to the merged path.
    app.url_map.merge_slashes = False
    app.config["MAX_CONTENT_LENGTH"] = settings.api.max_upload_bytes + _MULTIPART_OVERHEAD
    app.json = FiniteJSONProvider(app)
    if celery is None:
        from app.celery_config import make_celery

        celery = make_celery(settings)
    app.extensions["murmur"] = build_services(
        settings, celery, db=db, clock=clock, redis_connect_timeout=2
    )
    if own_start:
        # Nor does it serve on a database nobody migrated (every request would be a 500 on
        # a missing table): say so once, at the start.
        from app.migrate import database_schema_problem

        problem = database_schema_problem(app.extensions["murmur"].db)
        if problem is not None:
            raise ApiCannotStart(f"cannot start the API: {problem}")
    app.extensions[SYNC_SLOTS] = SyncSlots(settings.api.sync_max_waiting)
    app.extensions[STREAM_SLOTS] = StreamSlots(settings.api.stream_max_open)
    # The hub's Redis socket timeout is above its short XREAD block (app/jobs/event_hub.py).
    app.extensions[EVENT_HUB] = EventHub(lambda: redis_client(settings, socket_timeout=10))
    register_error_handlers(app)
    app.before_request(check_request_text)
    app.after_request(read_refused_body)
    problem = scrape_token_problem(settings)
    if problem is not None:  # names the rule, never the token
        log.warning("/metrics stays disabled: %s", problem)

    from app.api_docs import docs_bp
    from app.fleet.views import fleet_bp
    from app.health import health_bp
    from app.internal import internal_bp
    from app.jobs.views import jobs_bp
    from app.observability.views import observability_bp
    from app.wasr.views import wasr_bp

    blueprints = (health_bp, docs_bp, jobs_bp, wasr_bp, internal_bp, fleet_bp, observability_bp)
    for blueprint in blueprints:
        app.register_blueprint(blueprint)
    return app
