"""The worker's liveness signal when usage reports are off: a tiny authenticated POST per interval.

The fleet deletes a worker it has not heard from for three intervals and re-routes its job, so
a crashed worker process on a still-running machine does not hold a job (and a bill) forever.
With usage reports on, each report is the heartbeat and this thread is not started.
"""

from __future__ import annotations

import logging
import threading
from urllib.parse import quote

import requests
from pydantic import SecretStr

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT = (3.0, 5.0)  # connect, read: a heartbeat never waits long


class Heartbeat:
    def __init__(
        self,
        *,
        control_url: str,
        worker_id: str,
        instance_id: str,
        token: SecretStr,
        interval_seconds: float,
        session: requests.Session | None = None,
    ) -> None:
        self._url = (
            f"{control_url.rstrip('/')}/internal/workers/"
            f"{quote(worker_id, safe='')}/{quote(instance_id, safe='')}/heartbeat"
        )
        self._token = token
        self._interval = interval_seconds
        self._session = session or requests.Session()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.delivered = 0

    def beat(self) -> bool:
        headers = {"Authorization": f"Bearer {self._token.get_secret_value()}"}
        try:
            with self._session.post(
                self._url,
                json={},
                headers=headers,
                timeout=HEARTBEAT_TIMEOUT,
                allow_redirects=False,
            ) as response:
                ok = response.status_code == 200
                if not ok:
                    log.warning("heartbeat refused: HTTP %d", response.status_code)
        except requests.RequestException as exc:  # the URL is in requests' messages: type only
            log.warning("heartbeat lost (%s)", type(exc).__name__)
            ok = False
        self.delivered += ok
        return ok

    def _run(self) -> None:
        while not self._stop.is_set():
            self.beat()
            self._stop.wait(self._interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
