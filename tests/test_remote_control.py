"""The control worker takes no orders over the broker (docs/deploy-workers.md, "No remote control").

GPU workers share its broker; with Celery's remote control on, any of them could broadcast
`shutdown` or `revoke` to it. A real control worker, a real broadcast.
"""

from __future__ import annotations

import time

import pytest

from app.celery_config import make_celery
from tests.conftest import LiveApi, Proc


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_control_worker_ignores_a_broadcast_shutdown(
    live_api: LiveApi, control_worker: Proc
) -> None:
    app = make_celery(live_api.settings)
    try:
        assert not app.control.inspect(timeout=2).ping()  # nobody answers
        app.control.broadcast("shutdown")
        time.sleep(3)  # a worker obeying it stops within a second
        assert control_worker.popen.poll() is None, control_worker.output()[-2000:]
    finally:
        app.close()
