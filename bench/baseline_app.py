"""The throughput baseline: a Flask endpoint that reads the upload and only calls `delay()`."""

from __future__ import annotations

import os

from celery import Celery
from flask import Flask, jsonify, request

celery = Celery("baseline", broker=os.environ["MURMUR_REDIS_URL"])
celery.conf.task_ignore_result = True


@celery.task(name="baseline.noop")
def noop(size: int) -> int:
    return size


app = Flask("baseline")


@app.post("/submit")
def submit():  # type: ignore[no-untyped-def]
    size = len(request.files["file"].read())
    noop.delay(size)
    return jsonify({"size": size}), 202


@app.get("/healthz")
def healthz():  # type: ignore[no-untyped-def]
    return jsonify({"status": "ok"})
