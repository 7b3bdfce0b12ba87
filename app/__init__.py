"""Murmur control plane: the Flask API and the domain it serves (jobs, fleet, workers)."""

from __future__ import annotations

from app.factory import create_app

__all__ = ["create_app"]
