"""The API process's `Services` (app/services.py), built once in `create_app` and reached from a
request via `services()`."""

from __future__ import annotations

from flask import current_app

from app.services import Services


def services() -> Services:
    svc: Services = current_app.extensions["murmur"]
    return svc


__all__ = ["Services", "services"]
