"""Stop every worker the local provider still runs, e.g. when `make demo` shuts down."""

from __future__ import annotations

import logging

from sqlalchemy import func, select

from app.config import load_settings
from app.db import Database
from app.fleet.providers.local import LocalProvider
from app.models import Worker, WorkerState
from app.services import utc_clock
from app.transitions import move_worker, worker_sources

log = logging.getLogger("murmur.fleet")


def delete_all_local_workers() -> int:
    """Delete every local instance (SIGTERM, then SIGKILL) and retire its worker row.

    Used once the control worker is gone, so nothing re-creates them meanwhile. Returns how
    many instances were deleted.
    """
    settings = load_settings()
    # A short grace: the stack is stopping, a job cut short is re-run next start.
    provider = LocalProvider(settings, term_grace=5.0, teardown_wait=10.0)
    deleted: list[str] = []
    for instance in provider.list_by_tag(frozenset()):
        if provider.delete(instance.instance_id, instance.resources).confirmed:
            deleted.append(instance.instance_id)
            log.info("fleet: deleted worker %s (stack stopped)", instance.worker_id)
    if deleted:
        db = Database(settings.database_url)
        try:
            now = utc_clock()
            with db.session() as s:
                ids = s.scalars(
                    select(Worker.id).where(
                        Worker.provider == "local",
                        Worker.instance_id.in_(deleted),
                        Worker.deleted_at.is_(None),
                    )
                ).all()
                for worker_id in ids:  # deleting, then deleted: the provider confirmed it
                    move_worker(
                        s,
                        worker_id,
                        worker_sources(WorkerState.DELETING),
                        WorkerState.DELETING,
                        delete_requested_at=func.coalesce(Worker.delete_requested_at, now),
                        delete_reason=func.coalesce(Worker.delete_reason, "stack stopped"),
                    )
                    move_worker(
                        s, worker_id, [WorkerState.DELETING], WorkerState.DELETED, deleted_at=now
                    )
        finally:
            db.dispose()
    return len(deleted)
