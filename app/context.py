"""The services one API process holds, built once in `create_app` and reached via `services()`."""

from __future__ import annotations

from dataclasses import dataclass

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


def services() -> Services:
    svc: Services = current_app.extensions["murmur"]
    return svc
