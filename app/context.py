"""The services one API process holds, built once in `create_app` and reached via `services()`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis
from celery import Celery
from flask import current_app

from app.config import Settings
from app.db import Database
from app.storage import AudioStore


@dataclass
class Services:
    settings: Settings
    db: Database
    redis: redis.Redis
    celery: Celery
    storage: AudioStore
    # When this API process started: until a reconcile is ever recorded, the control
    # plane's silence counts from here (app.fleet.liveness).
    started_at: float = field(default_factory=time.time)


def services() -> Services:
    svc: Services = current_app.extensions["murmur"]
    return svc
