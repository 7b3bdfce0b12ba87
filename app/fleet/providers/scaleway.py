"""The `scaleway` provider: GPU instances through the official SDK (`scaleway` 2.12.0).

Create = `create_server` (tagged, zone, image, security group, Block root volume; the server
stays stopped) -> cloud-init user data -> `poweron`. Delete follows the teardown recipe: no
single call removes a server with its Block volumes and flexible IPs, so each is removed and
read back. Every state the API reports has a next step (`teardown_step`), so no server is left
billed because its state had no way out. A listing keeps only servers whose own tags name the
fleet and a worker (the API's tag filter is not trusted), so nothing else is ever swept. Every
SDK call runs under `bounded` because the SDK gives requests no timeout.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

import requests
from scaleway import Client, ScalewayException
from scaleway.block.v1 import BlockV1API, VolumeStatus
from scaleway.instance.v1 import ServerAction, VolumeServerTemplate, VolumeVolumeType
from scaleway.instance.v1.custom_api import InstanceUtilsV1API

from app.config import Profile, Settings
from app.fleet.cloudinit import render_user_data
from app.fleet.planner import stock_detail
from app.fleet.providers.base import (
    FLEET_TAG,
    PROFILE_TAG,
    WORKER_TAG,
    Bind,
    Instance,
    InstanceState,
    InvalidArgument,
    OutOfStock,
    PermissionDenied,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    QuotaExceeded,
    RateLimited,
    Teardown,
    bounded,
    is_fleet_worker,
    is_stopped,
    tag_value,
    worker_tags,
)
from gpu_worker.protocol.redaction import redact

log = logging.getLogger("murmur.fleet.scaleway")

T = TypeVar("T")

# GPU types boot from Block Storage (L4/L40S/H100 accept no local volume); sizes are bytes.
ROOT_VOLUME_BYTES = 50 * 10**9
USER_DATA_KEY = "cloud-init"
_GONE_VOLUME_STATES = frozenset({VolumeStatus.DELETED.value})
_LOCAL_VOLUME_TYPES = frozenset({"l_ssd", "scratch"})
_PAGE = 100


class _NoUserDataInLogs(logging.Filter):
    """The SDK logs whole request bodies at DEBUG; user data carries the instance credential."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "/user_data" not in record.getMessage()


_SDK_LOG_FILTER = _NoUserDataInLogs()
logging.getLogger("scaleway").addFilter(_SDK_LOG_FILTER)


class _NotFound(ProviderError):
    pass


class _Busy(ProviderError):
    """409 transient_state / locked: the resource is changing state; try again later."""


# A provider error's detail is shown in last_error, /v1/fleet and the logs: bounded, one line.
MAX_DETAIL = 300
# Scaleway access keys; URLs, hex tokens and `key=value` secrets go by the log-line rules
# (gpu_worker/protocol/redaction.py).
_ACCESS_KEY = re.compile(r"(?i)\bSCW[A-Z0-9]{17}\b")
_SPACE = re.compile(r"\s+")


def redact_detail(text: str, secrets: Collection[str] = ()) -> str:
    """`text` on one line, without secrets, URLs or long hex tokens, at most MAX_DETAIL chars."""
    text = _ACCESS_KEY.sub("<secret>", redact(text, secrets))
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


def _response_of(exc: BaseException) -> requests.Response | None:
    """The response whose body failed to parse: the SDK calls `res.json()` on every error
    status, and requests' JSONDecodeError does not carry it, but the frame of `json()` does."""
    tb = exc.__traceback__
    found = None
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if isinstance(candidate, requests.Response):
            found = candidate
        tb = tb.tb_next
    return found


def retry_after(res: requests.Response) -> float | None:
    """The seconds a `Retry-After` header asks for, or None (absent, or an HTTP date, which
    would need the API's clock to read)."""
    raw = res.headers.get("retry-after", "").strip()
    try:
        seconds = float(raw)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _unraised_error(exc: BaseException) -> ScalewayException | None:
    """The API error the SDK failed to raise: for a body whose message is "Validation Error"
    `_throw_on_error` reads `data["fields"]` unguarded, so one without `fields` escapes as a
    KeyError. The response is still in that frame; only a KeyError raised there qualifies."""
    if not isinstance(exc, KeyError):
        return None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        res = frame.f_locals.get("res")
        if frame.f_code.co_name == "_throw_on_error" and isinstance(res, requests.Response):
            return ScalewayException(res)
        tb = tb.tb_next
    return None


def _explain(body: dict[str, Any]) -> str:
    """What the API says beyond its message: invalid arguments, quotas, permissions, fields."""
    parts: list[str] = []
    for d in body.get("details") or []:
        if not isinstance(d, dict):
            continue
        if "argument_name" in d:
            help_message = d.get("help_message") or d.get("reason") or "invalid"
            parts.append(f"{d['argument_name']}: {help_message}")
        elif "quota" in d:
            parts.append(f"{d.get('resource')} quota {d.get('quota')}, current {d.get('current')}")
        elif "action" in d:
            parts.append(f"{d.get('action')} on {d.get('resource')}")
    fields = body.get("fields")
    if isinstance(fields, dict):  # the legacy "Validation Error" form
        for name, problems in fields.items():
            said = "; ".join(str(p) for p in problems) if isinstance(problems, list) else problems
            parts.append(f"{name}: {said}")
    if not parts and body.get("resource"):
        parts.append(f"resource {body['resource']}")
    return "; ".join(parts)


def classify(exc: BaseException, what: str, secrets: Collection[str] = ()) -> ProviderError:
    """The typed error for an SDK/transport failure (docs/fleet.md, "Fallback happens on
    capacity only").

    Its reason keeps what the API said (status, type, message, argument details), redacted
    and bounded, so an operator can act on it from `last_error`.
    """
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, requests.exceptions.JSONDecodeError):
        res = _response_of(exc)
        if res is None:
            return ProviderUnavailable(f"{what}: the API answered with an unreadable error body")
        ctype = res.headers.get("content-type", "").split(";")[0] or "no content type"
        shape = f"non-JSON body ({ctype})" if res.content else "empty body"
        said = redact_detail(f"{what}: HTTP {res.status_code}, {shape}", secrets)
        if res.status_code == 429:  # a proxy's page: a rate limit all the same
            return RateLimited(said, retry_after=retry_after(res))
        if res.status_code >= 500:
            return ProviderUnavailable(said)
        return InvalidArgument(said)
    if isinstance(exc, requests.exceptions.Timeout):
        return ProviderTimeout(f"{what}: the API did not answer in time")
    if isinstance(exc, requests.exceptions.RequestException):
        return ProviderUnavailable(f"{what}: cannot reach the API ({type(exc).__name__})")
    exc = _unraised_error(exc) or exc
    if not isinstance(exc, ScalewayException):
        return ProviderUnavailable(f"{what}: unexpected failure ({type(exc).__name__})")
    status = exc.response.status_code
    try:
        parsed = exc.response.json() if exc.response.content else {}
    except ValueError:
        parsed = {}
    body: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
    kind = body.get("type")
    message = str(body.get("message", "")).strip()
    said = f"{what}: HTTP {status} {kind or ''} {message}".replace("  ", " ").strip()
    explained = _explain(body)
    if explained:
        said = f"{said} ({explained})"
    said = redact_detail(said, secrets)
    if kind == "out_of_stock":
        return OutOfStock(said)
    if kind == "quotas_exceeded" or "quota exceeded" in message.lower():
        return QuotaExceeded(said)
    if kind in ("not_found", "unknown_resource") or status == 404:
        return _NotFound(said)
    if kind in ("transient_state", "locked") or status == 409:
        return _Busy(said)
    if kind in ("permissions_denied", "denied_authentication") or status in (401, 403):
        return PermissionDenied(said)
    if status == 429 or kind == "too_many_requests":
        # The API's, not the request's, fault: retried later on the same profile, when the API
        # says (Retry-After), as the non-JSON 429 above is.
        return RateLimited(said, retry_after=retry_after(exc.response))
    if status >= 500:
        return ProviderUnavailable(said)
    return InvalidArgument(said)


# The one next step of a teardown, per state the API reports (docs/fleet.md,
# "Teardown", and each state's allowed_actions).
DELETE = "delete"
TERMINATE = "terminate"  # the ServerAction values, as plain strings
STOP_IN_PLACE = "stop_in_place"
POWEROFF = "poweroff"
WAIT = "wait"
_PREFERRED = (TERMINATE, STOP_IN_PLACE, POWEROFF)


def teardown_step(state: str, allowed: Collection[str]) -> str:
    """What to send to a server in `state` to move it toward gone (pure; table-tested).

    - `stopped`: DELETE (terminate is not allowed there; DELETE takes a stopped server).
    - `stopping`, `locked`: wait; the API accepts nothing meanwhile (a locked server is held by
      Scaleway; the teardown stays pending, with the state in the worker's error).
    - `running`, `stopped in place`: terminate (stops and deletes it; Block volumes detach).
    - `starting`: `stop_in_place`, the only stop it allows (it may never leave `starting`),
      then `terminate` from `stopped in place`.
    - any other state: the first of terminate, stop_in_place, poweroff it allows, else wait.
    A listed action wins over the per-state default, so an API that allows more still gets a
    step that works.
    """
    known = InstanceState.of(state)
    if known == InstanceState.STOPPED:
        return DELETE
    if known in (InstanceState.STOPPING, InstanceState.LOCKED):
        return WAIT
    for action in _PREFERRED:
        if action in allowed:
            return action
    if known in (InstanceState.RUNNING, InstanceState.STOPPED_IN_PLACE):
        return TERMINATE
    if known == InstanceState.STARTING:
        return STOP_IN_PLACE
    return WAIT


def _still_there(instance_id: str, server: Any) -> str:
    detail = f" ({server.state_detail})" if getattr(server, "state_detail", None) else ""
    return f"server {instance_id} is {server.state}{detail}"


class ScalewayProvider:
    name = "scaleway"

    def __init__(
        self,
        settings: Settings,
        *,
        poll_interval: float = 1.0,
        teardown_wait: float = 5.0,
        root_volume_bytes: int = ROOT_VOLUME_BYTES,
    ) -> None:
        self._settings = settings
        self._project = settings.scaleway.project_id
        self._timeout = settings.fleet.provider_timeout_seconds
        self._poll = poll_interval
        self._teardown_wait = teardown_wait
        self._root_bytes = root_volume_bytes
        self._secrets = (
            settings.reveal("scaleway_secret_key"),
            settings.reveal("scaleway_access_key"),
        )
        client = Client(
            access_key=settings.reveal("scaleway_access_key"),
            secret_key=settings.reveal("scaleway_secret_key"),
            api_url=settings.scaleway.api_url.rstrip("/"),
            default_project_id=self._project or None,
        )
        try:
            self._instance = InstanceUtilsV1API(client)
            self._block = BlockV1API(client)
        except ValueError as exc:  # the SDK validates key shapes, project id and URL up front
            raise InvalidArgument(f"scaleway client: {exc}") from None

    # -- plumbing ---------------------------------------------------------------------------

    def _call(self, what: str, call: Callable[[], T]) -> T:
        try:
            return bounded(call, self._timeout, what)
        except Exception as exc:
            raise classify(exc, what, self._secrets) from None

    def _resources(self, server: Any, zone: str, worker_id: str | None) -> dict[str, Any]:
        volumes = [
            v.id
            for v in (server.volumes or {}).values()
            if str(v.volume_type) == VolumeVolumeType.SBS_VOLUME.value and v.id
        ]
        ips = [ip.id for ip in (server.public_ips or []) if not ip.dynamic and ip.id]
        resources: dict[str, Any] = {
            "zone": zone,
            "worker_id": worker_id,
            "volumes": volumes,
            "ips": ips,
        }
        # Instance API volumes (RENDER-S takes l_ssd): terminate deletes them, but whether a
        # DELETE of a stopped server does is unconfirmed, so they are read back too.
        local = [
            v.id
            for v in (server.volumes or {}).values()
            if str(v.volume_type) in _LOCAL_VOLUME_TYPES and v.id
        ]
        if local:
            resources["local_volumes"] = local
        return resources

    def _instance_of(self, server: Any, zone: str) -> Instance:
        tags = list(server.tags or [])
        worker_id = tag_value(tags, WORKER_TAG)
        return Instance(
            instance_id=server.id,
            state=InstanceState.of(server.state),
            worker_id=worker_id,
            profile=tag_value(tags, PROFILE_TAG),
            resources=self._resources(server, zone, worker_id),
            detail=str(server.state_detail or ""),
        )

    def _get_server(self, instance_id: str, zone: str) -> Any | None:
        try:
            return self._call(
                "get_server",
                lambda: self._instance.get_server(server_id=instance_id, zone=zone),
            ).server
        except _NotFound:
            return None

    # -- the interface ----------------------------------------------------------------------

    def create(self, profile: Profile, worker_id: str, bind: Bind) -> Instance:
        zone = profile.zone
        group = self._settings.security_groups.get(profile.security_group)
        if group is None or group.zone != zone:
            raise InvalidArgument(
                f"profile {profile.name}: security group {profile.security_group!r} "
                f"is not declared for zone {zone}"
            )
        server = self._call(
            "create_server",
            lambda: self._instance.create_server(
                zone=zone,
                commercial_type=profile.server_type,
                image=profile.image,
                name=f"murmur-{worker_id}",
                project=self._project or None,
                tags=worker_tags(worker_id, profile.name),
                security_group=group.id,
                dynamic_ip_required=True,
                volumes={
                    "0": VolumeServerTemplate(
                        volume_type=VolumeVolumeType.SBS_VOLUME, size=self._root_bytes
                    )
                },
                protected=False,
            ),
        ).server
        resources = self._resources(server, zone, worker_id)
        try:
            environment = bind(server.id, resources)
            # Rendered here, never logged: it carries the instance credential.
            user_data = render_user_data(dict(environment), profile).encode()
            self._call(
                "set_server_user_data",
                lambda: self._instance.set_server_user_data(
                    server_id=server.id, key=USER_DATA_KEY, content=user_data, zone=zone
                ),
            )
            self._call(
                "server_action poweron",
                lambda: self._instance.server_action(
                    server_id=server.id, action=ServerAction.POWERON, zone=zone
                ),
            )
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Ctrl-C or SIGTERM mid-create: the server is deleted before the interruption
                # goes on, or nothing would ever know about it.
                self._abandon(server.id, resources, classify(exc, "create", self._secrets))
                raise
            if isinstance(exc, ValueError) and not isinstance(exc, ProviderError):
                error: ProviderError = InvalidArgument(f"create: {exc}")  # e.g. user data too big
            else:
                error = classify(exc, "create", self._secrets)
            self._abandon(server.id, resources, error)
            raise error from None
        # An out-of-stock may also come after an accepted poweron: the server falls back to
        # stopped (state_detail says why). Look once; later falls are the planner's to see.
        # Right after the 202 the API may still show `stopped` with nothing said: that server
        # is on its way up, not out of stock (app.fleet.planner waits for `starting` or a
        # stock detail). A failed look reports "unknown", never an assumed `starting`.
        state: str = InstanceState.UNKNOWN
        detail = ""
        with contextlib.suppress(ProviderError):
            after = self._get_server(server.id, zone)
            if after is not None:
                state, detail = InstanceState.of(after.state), str(after.state_detail or "")
        if is_stopped(state) and stock_detail(detail):
            error = OutOfStock(
                redact_detail(
                    f"server_action poweron: accepted, then the server fell back to {state}"
                    + (f" ({detail})" if detail else "")
                )
            )
            self._abandon(server.id, resources, error)
            raise error
        return Instance(server.id, state, worker_id, profile.name, resources, detail)

    def _abandon(
        self, instance_id: str, resources: Mapping[str, Any], error: ProviderError
    ) -> None:
        """A created server that could not start is deleted now; what remains is handed on."""
        try:
            result = self.delete(instance_id, resources)
        except ProviderError as exc:
            result = Teardown(False, resources, exc.reason)
        if not result.confirmed:
            log.warning("server %s left after a failed start: %s", instance_id, result.detail)
            error.leftover(instance_id, result.resources)

    def get(self, instance_id: str, resources: Mapping[str, Any]) -> Instance | None:
        zone = str(resources.get("zone") or "")
        if not zone:
            raise InvalidArgument(f"instance {instance_id}: no zone recorded")
        server = self._get_server(instance_id, zone)
        return None if server is None else self._instance_of(server, zone)

    def list_by_tag(self, scopes: frozenset[str]) -> list[Instance]:
        found: list[Instance] = []
        for zone in sorted(scopes):
            servers = self._call(
                f"list_servers {zone}",
                lambda zone=zone: self._instance.list_servers_all(  # type: ignore[misc]
                    zone=zone, tags=[FLEET_TAG], project=self._project or None, per_page=_PAGE
                ),
            )
            # Checked on each server's own tags: the `tags` filter narrows the listing, but what
            # it matches at Scaleway is not confirmed, and whatever this returns may be deleted.
            found.extend(
                self._instance_of(s, zone) for s in servers if is_fleet_worker(list(s.tags or []))
            )
        return found

    def availability(self, profile: Profile) -> str | None:
        try:
            for page in range(1, 6):  # the catalog spans a couple of pages; never loop forever
                answer = self._call(
                    "get_server_types_availability",
                    lambda page=page: self._instance.get_server_types_availability(  # type: ignore[misc]
                        zone=profile.zone, page=page, per_page=_PAGE
                    ),
                )
                servers = answer.servers or {}
                if profile.server_type in servers:
                    return str(servers[profile.server_type].availability)
                if not servers:
                    return None
        except ProviderError:
            return None  # a hint only
        return None

    def delete(self, instance_id: str, resources: Mapping[str, Any]) -> Teardown:
        zone = str(resources.get("zone") or "")
        if not zone:
            raise InvalidArgument(f"instance {instance_id}: no zone recorded")
        worker_id = resources.get("worker_id")
        volumes = list(dict.fromkeys(resources.get("volumes") or []))
        local = list(dict.fromkeys(resources.get("local_volumes") or []))
        ips = list(dict.fromkeys(resources.get("ips") or []))
        deadline = time.monotonic() + self._teardown_wait
        gone = False  # the server itself, confirmed by a read that no longer finds it

        def progress(confirmed: bool, detail: str = "") -> Teardown:
            left = {"zone": zone, "worker_id": worker_id, "volumes": volumes, "ips": ips}
            if local:
                left["local_volumes"] = local
            return Teardown(confirmed, left, detail, server_gone=gone or confirmed)

        try:
            # 1-3: learn the server's Block volumes and flexible IPs, stop it, wait until gone.
            # A server may need several steps (starting -> stop_in_place -> stopped in place ->
            # terminate): look, act, look again until it is gone or the pass's time is up.
            server = self._get_server(instance_id, zone)
            sent: set[tuple[str, str]] = set()
            while server is not None:
                learned = self._resources(server, zone, worker_id)
                volumes = list(dict.fromkeys(volumes + learned["volumes"]))
                local = list(dict.fromkeys(local + learned.get("local_volumes", [])))
                ips = list(dict.fromkeys(ips + learned["ips"]))
                self._remove_server(server, zone, sent)
                if time.monotonic() + self._poll >= deadline:
                    return progress(False, _still_there(instance_id, server))
                time.sleep(self._poll)
                server = self._get_server(instance_id, zone)
            gone = True
            # 4: Block volumes are only detached by terminate; delete each once available.
            volumes = [v for v in volumes if not self._delete_volume(v, zone, deadline)]
            local = [v for v in local if not self._delete_local_volume(v, zone)]
            # 5-6: flexible IPs outlive servers: those recorded, then any carrying our tag.
            if worker_id:
                tagged = self._call(
                    "list_ips",
                    lambda: self._instance.list_ips(
                        zone=zone,
                        tags=[f"{WORKER_TAG}{worker_id}"],
                        project=self._project or None,
                        per_page=_PAGE,
                    ),
                ).ips
                ips = list(dict.fromkeys(ips + [ip.id for ip in tagged or []]))
            ips = [ip for ip in ips if not self._delete_ip(ip, zone)]
        except ProviderError as exc:
            return progress(False, exc.reason)
        if volumes or local or ips:
            count = len(volumes) + len(local)
            return progress(False, f"{count} volume(s), {len(ips)} IP(s) still present")
        return progress(True)

    # -- teardown steps ---------------------------------------------------------------------

    def _remove_server(self, server: Any, zone: str, sent: set[tuple[str, str]]) -> None:
        """Send the next `teardown_step` for the server's state, each step once per state."""
        state = str(server.state)
        step = teardown_step(state, [str(a) for a in server.allowed_actions or []])
        if step == WAIT or (state, step) in sent:
            return
        sent.add((state, step))
        try:
            if step == DELETE:
                self._call(
                    "delete_server",
                    lambda: self._instance.delete_server(server_id=server.id, zone=zone),
                )
            else:
                action = ServerAction(step)
                self._call(
                    f"server_action {step}",
                    lambda: self._instance.server_action(
                        server_id=server.id, action=action, zone=zone
                    ),
                )
        except (_NotFound, _Busy):
            pass  # already going away, or changing state: the next look decides again

    def _volume_status(self, volume_id: str, zone: str) -> str | None:
        try:
            volume = self._call(
                "block get_volume",
                lambda: self._block.get_volume(volume_id=volume_id, zone=zone),
            )
        except _NotFound:
            return None
        status = str(volume.status)
        return None if status in _GONE_VOLUME_STATES else status

    def _delete_volume(self, volume_id: str, zone: str, deadline: float) -> bool:
        """True once the volume is confirmed gone (a read answers 404, or `deleted`).

        A volume `deleting` has had its DELETE accepted: it is not waited for here (that could
        take the whole teardown wait, holding up the rest), only read again next round.
        """
        status = self._volume_status(volume_id, zone)
        settled = (None, VolumeStatus.AVAILABLE.value, VolumeStatus.DELETING.value)
        while status not in settled and time.monotonic() < deadline:
            time.sleep(self._poll)  # detaching after the server went away
            status = self._volume_status(volume_id, zone)
        if status is None:
            return True
        if status != VolumeStatus.AVAILABLE.value:
            return False  # still detaching, or deleting: the next round reads it again
        with contextlib.suppress(_NotFound, _Busy):
            self._call(
                "block delete_volume",
                lambda: self._block.delete_volume(volume_id=volume_id, zone=zone),
            )
        return self._volume_status(volume_id, zone) is None

    def _delete_local_volume(self, volume_id: str, zone: str) -> bool:
        """True once the Instance API volume is confirmed gone (its server is gone already)."""
        try:
            self._call(
                "get_volume",
                lambda: self._instance.get_volume(volume_id=volume_id, zone=zone),
            )
        except _NotFound:
            return True
        with contextlib.suppress(_NotFound, _Busy):
            self._call(
                "delete_volume",
                lambda: self._instance.delete_volume(volume_id=volume_id, zone=zone),
            )
        try:
            self._call(
                "get_volume",
                lambda: self._instance.get_volume(volume_id=volume_id, zone=zone),
            )
        except _NotFound:
            return True
        return False

    def _delete_ip(self, ip_id: str, zone: str) -> bool:
        """True once the flexible IP is confirmed gone."""
        try:
            self._call("delete_ip", lambda: self._instance.delete_ip(ip=ip_id, zone=zone))
        except _NotFound:
            return True
        try:
            self._call("get_ip", lambda: self._instance.get_ip(ip=ip_id, zone=zone))
        except _NotFound:
            return True
        return False
