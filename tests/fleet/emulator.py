"""A local HTTP emulator of the Scaleway Instance/Block API subset the fleet uses, with faults.

The real `scaleway` SDK talks to it over HTTP. Shapes follow the real API (docs/fleet.md,
"Teardown"): servers are created stopped; `poweron` moves them through `starting` to `running`;
`terminate` goes through `stopping` and then the server is gone, its Block volumes detached
(`available`) and its flexible IPs detached but kept; a stopped server is removed by DELETE.
Lists page with `page`/`per_page` and answer an empty page past the end (the SDK's `*_all`
stops only there). `list_tag_filter = False` makes the server list ignore its `tags` filter
(what the real filter matches is not confirmed), so foreign servers come back in it.

State changes are counted in observations (reads of the server), not in seconds, so tests are
deterministic. Faults are injected per operation, zone and commercial type: out of stock,
quota, permission, 500 (JSON), 502 (HTML), invalid argument, slow answers, a server that never
leaves `starting`, a flexible IP attached at power-on (a leak to clean up).

Each state allows what recorded traffic shows (`ALLOWED_ACTIONS`): a `starting` server only
`stop_in_place`/`backup`, so the way out of a start that never ends is `stop_in_place`, then
`terminate` from `stopped in place`; DELETE takes only a `stopped` server; a `locked` server
allows nothing. An action a state does not allow answers 409 `transient_state` in a transient
state (`starting`, `stopping`, `locked`) and 400 otherwise. An out-of-stock may also come after
an accepted `poweron`: the server falls back to `stopped`, state_detail "out of stock".

An optional `host` plays what runs on a server: told at an accepted `poweron` (with the
server's user data) and when the server is asked to stop (`terminate`, `poweroff`,
`stop_in_place`, DELETE), so a test can run a real worker from the rendered cloud-init.

A Block volume may stay `deleting` for a while after its DELETE (the Block API's VolumeStatus
has that state): `volume_deleting_reads = N` shows it so for N reads, then it is gone (404).

Assumptions where the reference is silent: deleting a Block volume that is still attached
answers 409 `precondition_failed`; a `stop_in_place` releases nothing (IPs stay attached);
`terminate` deletes local (`l_ssd`) volumes, DELETE of a stopped server only detaches them
(the reference leaves it open; the emulator models the costlier case).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from werkzeug.exceptions import HTTPException, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.serving import WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

CATALOG = {
    "fr-par-1": {"RENDER-S": 1.2426, "L4-1-24G": 0.75, "DEV1-S": 0.0088},
    "fr-par-2": {"L4-1-24G": 0.75, "L4-2-24G": 1.5, "L40S-1-48G": 1.4, "H100-1-80G": 2.73},
    "pl-waw-2": {"L4-1-24G": 0.75, "L40S-1-48G": 1.4},
}

RUNNING_ACTIONS = ["poweroff", "terminate", "reboot", "stop_in_place", "backup"]
STOPPED_ACTIONS = ["poweron", "backup"]
STARTING_ACTIONS = ["stop_in_place", "backup"]
STOPPED_IN_PLACE_ACTIONS = ["poweron", "poweroff", "terminate", "reboot", "backup"]
# What each state the API reports allows (as the real API lists them in `allowed_actions`).
ALLOWED_ACTIONS: dict[str, list[str]] = {
    "running": RUNNING_ACTIONS,
    "stopped": STOPPED_ACTIONS,
    "starting": STARTING_ACTIONS,
    "stopped in place": STOPPED_IN_PLACE_ACTIONS,
    "stopping": [],
    "locked": [],
}
_TRANSIENT = ("starting", "stopping", "locked")


def _now() -> str:
    return datetime.now(UTC).isoformat()


class InstanceHost(Protocol):
    """What runs on the emulated servers (tests/fleet/worker_host.py runs real workers)."""

    def power_on(self, server_id: str, user_data: dict[str, bytes]) -> None: ...

    def power_off(self, server_id: str) -> None: ...


@dataclass
class Fault:
    op: str  # create | poweron | terminate | poweroff | delete_server | get_server | list_servers
    #          user_data | availability | get_volume | delete_volume | delete_ip | list_ips | any
    kind: str  # out_of_stock | quota | permission | server_error | bad_gateway | empty_5xx
    #            rate_limited (429 JSON) | rate_limited_html (a proxy's 429)
    #            invalid | image_not_found | slow | never_start | attach_flexible_ip
    #            validation (legacy 400 "Validation Error" with `fields`)
    #            validation_without_fields (the same without `fields`: the SDK's KeyError)
    #            stock_after_poweron (accepted, then back to stopped: "out of stock")
    #            lagging_poweron (accepted; reads still show `stopped`, nothing said, for
    #            boot_observations reads, then `starting`, then `running`)
    #            local_volume (create: the server also gets an l_ssd volume)
    zone: str | None = None
    commercial_type: str | None = None
    times: int | None = None  # None: every time
    delay: float = 0.0
    hits: int = 0
    retry_after: str | None = None  # a Retry-After header on the error answer (a 429's)

    def matches(self, op: str, zone: str, ctype: str | None) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.op not in (op, "any"):
            return False
        if self.zone is not None and self.zone != zone:
            return False
        return self.commercial_type is None or self.commercial_type == ctype


_ERRORS: dict[str, tuple[int, dict[str, Any]]] = {
    "out_of_stock": (
        503,
        {"type": "out_of_stock", "resource": "server", "message": "resource is out of stock"},
    ),
    "quota": (
        403,
        {
            "type": "quotas_exceeded",
            "message": "quota(s) exceeded for this resource",
            "details": [{"resource": "gpu_instances", "quota": 1, "current": 1}],
        },
    ),
    "permission": (
        403,
        {
            "type": "permissions_denied",
            "message": "insufficient permissions",
            "details": [{"resource": "instance_server", "action": "create"}],
        },
    ),
    "server_error": (500, {"type": "internal_error", "message": "internal error"}),
    "rate_limited": (429, {"type": "too_many_requests", "message": "too many requests"}),
    "invalid": (
        400,
        {
            "type": "invalid_arguments",
            "message": "invalid argument(s)",
            "details": [{"argument_name": "image", "reason": "constraint", "help_message": "bad"}],
        },
    ),
    # The legacy Instance form of bad arguments (reference: "Validation Error" + `fields`).
    "validation": (
        400,
        {
            "type": "invalid_request_error",
            "message": "Validation Error",
            "fields": {"commercial_type": ["unknown server type"]},
        },
    ),
    # The same without `fields`: the SDK's `_throw_on_error` reads data["fields"] regardless.
    "validation_without_fields": (
        400,
        {"type": "invalid_request_error", "message": "Validation Error"},
    ),
    "image_not_found": (
        400,
        {
            "type": "invalid_arguments",
            "message": "invalid argument(s)",
            "details": [
                {
                    "argument_name": "image",
                    "reason": "constraint",
                    "help_message": "image not found",
                }
            ],
        },
    ),
}


@dataclass
class _Server:
    data: dict[str, Any]
    seq: int = 0  # creation order (list order)
    pending: tuple[str, int] | None = None  # (next state or "gone", observations left)
    user_data: dict[str, bytes] = field(default_factory=dict)


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # the test output stays readable; `requests` keeps the call log


class InstanceEmulator:
    """The emulated API; `start()` serves it on 127.0.0.1 and returns the base URL."""

    def __init__(
        self,
        *,
        secret_key: str,
        project_id: str,
        boot_observations: int = 1,
        stop_observations: int = 1,
        page_size: int = 50,
        host: InstanceHost | None = None,
    ) -> None:
        self.host = host
        self.secret_key = secret_key
        self.project_id = project_id
        self.boot_observations = boot_observations
        self.stop_observations = stop_observations
        self.page_size = page_size
        # False: GET /servers ignores `tags=` and lists every server of the zone and project.
        self.list_tag_filter = True
        # Reads a deleted Block volume still answers with status `deleting` before its 404.
        self.volume_deleting_reads = 0
        self._deleting: dict[str, int] = {}  # volume id -> `deleting` reads left
        self.lock = threading.RLock()
        self.servers: dict[str, _Server] = {}
        self.ips: dict[str, dict[str, Any]] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.local_volumes: dict[str, dict[str, Any]] = {}  # Instance API (l_ssd) volumes
        self.security_groups: dict[str, dict[str, Any]] = {}
        self.availability: dict[tuple[str, str], str] = {}
        self.faults: list[Fault] = []
        self.events: list[tuple[str, str, str]] = []  # (op, zone, id) in order
        self.requests: list[tuple[str, str]] = []
        self._mac = itertools.count(1)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.url = ""
        self._map = Map(
            [
                Rule("/instance/v1/zones/<zone>/servers", endpoint="servers"),
                Rule("/instance/v1/zones/<zone>/servers/<sid>", endpoint="server"),
                Rule("/instance/v1/zones/<zone>/servers/<sid>/action", endpoint="action"),
                Rule("/instance/v1/zones/<zone>/servers/<sid>/user_data", endpoint="ud_list"),
                Rule("/instance/v1/zones/<zone>/servers/<sid>/user_data/<key>", endpoint="ud"),
                Rule("/instance/v1/zones/<zone>/products/servers", endpoint="types"),
                Rule(
                    "/instance/v1/zones/<zone>/products/servers/availability",
                    endpoint="availability",
                ),
                Rule("/instance/v1/zones/<zone>/security_groups", endpoint="groups"),
                Rule("/instance/v1/zones/<zone>/security_groups/<gid>", endpoint="group"),
                Rule("/instance/v1/zones/<zone>/ips", endpoint="ips"),
                Rule("/instance/v1/zones/<zone>/ips/<ip>", endpoint="ip"),
                Rule("/instance/v1/zones/<zone>/volumes", endpoint="instance_volumes"),
                Rule("/instance/v1/zones/<zone>/volumes/<vid>", endpoint="instance_volume"),
                Rule("/block/v1/zones/<zone>/volumes", endpoint="block_volumes"),
                Rule("/block/v1/zones/<zone>/volumes/<vid>", endpoint="block_volume"),
            ]
        )

    # -- test controls ----------------------------------------------------------------------

    def inject(
        self,
        op: str,
        kind: str,
        *,
        zone: str | None = None,
        commercial_type: str | None = None,
        times: int | None = None,
        delay: float = 0.0,
        retry_after: str | None = None,
    ) -> Fault:
        fault = Fault(op, kind, zone, commercial_type, times, delay, retry_after=retry_after)
        with self.lock:
            self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def add_security_group(self, zone: str, name: str) -> str:
        gid = str(uuid.uuid4())
        with self.lock:
            self.security_groups[gid] = {
                "id": gid,
                "name": name,
                "description": "murmur workers",
                "organization": self.project_id,
                "project": self.project_id,
                "servers": [],
                "stateful": True,
                "inbound_default_policy": "drop",
                "outbound_default_policy": "accept",
                "organization_default": False,
                "project_default": False,
                "enable_default_security": True,
                "state": "available",
                "tags": ["murmur"],
                "zone": zone,
                "creation_date": _now(),
                "modification_date": _now(),
            }
        return gid

    def set_availability(self, zone: str, commercial_type: str, value: str) -> None:
        with self.lock:
            self.availability[(zone, commercial_type)] = value

    def inventory(self) -> dict[str, int]:
        """What is still billed: servers, IPs, Block and local volumes not deleted."""
        with self.lock:
            return {
                "servers": len(self.servers),
                "ips": len(self.ips),
                "volumes": sum(1 for v in self.volumes.values() if v["status"] != "deleted")
                + len(self.local_volumes),
            }

    def server(self, sid: str) -> dict[str, Any]:
        with self.lock:
            return json.loads(json.dumps(self.servers[sid].data))

    def user_data(self, sid: str) -> dict[str, bytes]:
        with self.lock:
            return dict(self.servers[sid].user_data)

    def set_state(
        self,
        sid: str,
        state: str,
        *,
        detail: str = "",
        allowed: list[str] | None = None,
        then: str | None = None,
    ) -> None:
        """Force a server's state (e.g. a worker that died and left its server stopped).

        `allowed` defaults to what the API allows in that state (none for a state it does not
        know); `then` is the state it reaches after `stop_observations` reads ("gone" too).
        """
        with self.lock:
            srv = self.servers[sid]
            srv.pending = None if then is None else (then, self.stop_observations)
            srv.data["state"] = state
            srv.data["state_detail"] = detail
            srv.data["allowed_actions"] = list(
                ALLOWED_ACTIONS.get(state, []) if allowed is None else allowed
            )

    def start(self) -> str:
        self._server = make_server(
            "127.0.0.1", 0, self.wsgi, threaded=True, request_handler=_QuietHandler
        )
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- HTTP plumbing ----------------------------------------------------------------------

    def wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        try:
            response = self._dispatch(request)
        except HTTPException as exc:
            response = self._error(exc.code or 500, "not_found", exc.description or "")
        return response(environ, start_response)

    @staticmethod
    def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
        return Response(
            json.dumps(body), status=status, content_type="application/json", headers=headers
        )

    def _error(self, status: int, kind: str, message: str, **extra: Any) -> Response:
        return self._json({"type": kind, "message": message, **extra}, status)

    def _fault(self, op: str, zone: str, ctype: str | None) -> Response | Fault | None:
        """The injected answer for this call, if any (slow faults only delay it)."""
        with self.lock:
            hit = [f for f in self.faults if f.matches(op, zone, ctype)]
            for f in hit:
                f.hits += 1
        answer: Response | Fault | None = None
        for f in hit:
            if f.kind == "slow":
                time.sleep(f.delay)
            elif f.kind == "bad_gateway":
                answer = answer or Response(
                    "<html>502 Bad Gateway</html>", 502, content_type="text/html"
                )
            elif f.kind == "empty_5xx":
                answer = answer or Response(b"", 503)
            elif f.kind == "rate_limited_html":  # a proxy's 429, not the API's JSON one
                answer = answer or Response(
                    "<html>429 Too Many Requests</html>", 429, content_type="text/html"
                )
            elif f.kind in _ERRORS:
                status, body = _ERRORS[f.kind]
                answer = answer or self._json(body, status)
            if isinstance(answer, Response) and f.retry_after is not None:
                answer.headers["Retry-After"] = f.retry_after
            else:
                answer = answer or f  # behaviour faults (never_start, attach_flexible_ip)
        return answer

    def _dispatch(self, request: Request) -> Response:
        self.requests.append((request.method, request.path))
        if request.headers.get("x-auth-token") != self.secret_key:
            return self._error(
                401,
                "denied_authentication",
                "authentication is denied",
                method="api_key",
                reason="invalid_secret_key",
            )
        adapter = self._map.bind_to_environ(request.environ)
        try:
            endpoint, args = adapter.match()
        except NotFound:
            return self._error(404, "not_found", f"no route {request.path}")
        zone = args.pop("zone")
        if zone not in CATALOG:
            return self._error(404, "not_found", f"zone {zone} is unknown", resource="zone")
        handler = getattr(self, f"_h_{endpoint}")
        response: Response = handler(request, zone, **args)
        return response

    def _page(
        self, request: Request, items: list[Any], size_param: str = "per_page"
    ) -> tuple[list[Any], dict[str, str]]:
        page = int(request.args.get("page") or 1)
        size = min(100, int(request.args.get(size_param) or self.page_size))
        start = (page - 1) * size
        return items[start : start + size], {"X-Total-Count": str(len(items))}

    # -- servers ----------------------------------------------------------------------------

    def _observe(self, srv: _Server) -> None:
        """Advance a pending transition by one observation."""
        if srv.pending is None:
            return
        target, left = srv.pending
        if left > 0:
            srv.pending = (target, left - 1)
            return
        srv.pending = None
        if target == "gone":
            self._remove(srv)
        elif target == "running":
            srv.data.update(state="running", state_detail="booted", allowed_actions=RUNNING_ACTIONS)
        elif target == "starting":  # a power-on that shows late (lagging_poweron)
            srv.data.update(
                state="starting", state_detail="provisioning node", allowed_actions=STARTING_ACTIONS
            )
            srv.pending = ("running", self.boot_observations)
        elif target in ("stopped", "out of stock"):
            # An out-of-stock after an accepted poweron: back to stopped, saying why.
            detail = "out of stock" if target == "out of stock" else ""
            srv.data.update(state="stopped", state_detail=detail, allowed_actions=STOPPED_ACTIONS)
            srv.data["public_ips"] = [ip for ip in srv.data["public_ips"] if not ip["dynamic"]]
            srv.data["public_ip"] = srv.data["public_ips"][0] if srv.data["public_ips"] else None
        elif target == "stopped in place":
            srv.data.update(
                state="stopped in place",
                state_detail="",
                allowed_actions=STOPPED_IN_PLACE_ACTIONS,
            )

    def _remove(self, srv: _Server, *, terminated: bool = True) -> None:
        sid = srv.data["id"]
        self.servers.pop(sid, None)
        for vol in srv.data["volumes"].values():
            block = self.volumes.get(vol["id"])
            if block is not None:  # terminate/DELETE only detach Block volumes
                block.update(status="available", references=[], last_detached_at=_now())
            local = self.local_volumes.get(vol["id"])
            if local is not None and terminated:  # terminate deletes local volumes
                del self.local_volumes[vol["id"]]
            elif local is not None:  # whether DELETE does is unconfirmed: model the worst
                local.update(server=None, modification_date=_now())
        for ip in self.ips.values():
            if ip["server"] and ip["server"]["id"] == sid:
                ip.update(server=None, state="detached")
        self.events.append(("gone", srv.data["zone"], sid))

    def _get(self, zone: str, sid: str) -> _Server | None:
        srv = self.servers.get(sid)
        if srv is None or srv.data["zone"] != zone:
            return None
        self._observe(srv)
        return self.servers.get(sid)

    def _not_found(self, sid: str, resource: str = "instance_server") -> Response:
        return self._error(
            404, "not_found", f"{resource} {sid} not found", resource=resource, resource_id=sid
        )

    def _h_servers(self, request: Request, zone: str) -> Response:
        if request.method == "POST":
            return self._create(request, zone)
        if (f := self._fault("list_servers", zone, None)) is not None and isinstance(f, Response):
            return f
        wanted = [t for t in (request.args.get("tags") or "").split(",") if t]
        project = request.args.get("project")
        with self.lock:
            for srv in list(self.servers.values()):
                if srv.data["zone"] == zone:
                    self._observe(srv)
            items = [
                s.data
                for s in sorted(self.servers.values(), key=lambda s: s.seq)
                if s.data["zone"] == zone
                and (not self.list_tag_filter or all(t in s.data["tags"] for t in wanted))
                and (project is None or s.data["project"] == project)
            ]
            page, headers = self._page(request, items)
            return self._json({"servers": page}, headers=headers)

    def _create(self, request: Request, zone: str) -> Response:
        body = request.get_json(force=True, silent=True) or {}
        ctype = body.get("commercial_type")
        if not ctype:
            return self._error(
                400,
                "invalid_arguments",
                "invalid argument(s)",
                details=[
                    {
                        "argument_name": "commercial_type",
                        "reason": "required",
                        "help_message": "commercial_type is required",
                    }
                ],
            )
        create_fault = self._fault("create", zone, ctype)
        if isinstance(create_fault, Response):
            return create_fault
        if ctype not in CATALOG[zone]:
            return self._error(
                400,
                "invalid_arguments",
                "invalid argument(s)",
                details=[
                    {
                        "argument_name": "commercial_type",
                        "reason": "constraint",
                        "help_message": f"{ctype} is not available in {zone}",
                    }
                ],
            )
        project = body.get("project") or body.get("organization")
        if not project:
            return self._error(400, "invalid_arguments", "project is required")
        with self.lock:
            group = None
            if body.get("security_group"):
                group = self.security_groups.get(body["security_group"])
                if group is None or group["zone"] != zone:
                    return self._not_found(body["security_group"], "instance_security_group")
            sid = str(uuid.uuid4())
            volumes: dict[str, Any] = {}
            templates = dict(
                body.get("volumes") or {"0": {"volume_type": "sbs_volume", "size": 10**10}}
            )
            if isinstance(create_fault, Fault) and create_fault.kind == "local_volume":
                templates[str(len(templates))] = {"volume_type": "l_ssd", "size": 10**10}
            for key, tpl in sorted(templates.items()):
                vid = str(uuid.uuid4())
                if tpl.get("volume_type") == "l_ssd":
                    self.local_volumes[vid] = {
                        "id": vid,
                        "name": f"{body.get('name')}-vol-{key}",
                        "export_uri": None,
                        "size": int(tpl.get("size") or 10**10),
                        "volume_type": "l_ssd",
                        "creation_date": _now(),
                        "modification_date": _now(),
                        "organization": project,
                        "project": project,
                        "tags": [],
                        "server": {"id": sid, "name": body.get("name")},
                        "state": "available",
                        "zone": zone,
                    }
                    volumes[key] = {"boot": False, "volume_type": "l_ssd", "id": vid, "zone": zone}
                    continue
                self.volumes[vid] = {
                    "id": vid,
                    "name": f"{body.get('name')}-vol-{key}",
                    "type": "sbs_5k",
                    "size": int(tpl.get("size") or 10**10),
                    "project_id": project,
                    "created_at": _now(),
                    "updated_at": _now(),
                    "references": [
                        {
                            "id": str(uuid.uuid4()),
                            "product_resource_type": "instance_server",
                            "product_resource_id": sid,
                            "status": "attached",
                        }
                    ],
                    "status": "in_use",
                    "tags": [],
                    "specs": {"perf_iops": 5000, "class": "sbs"},
                    "last_detached_at": None,
                    "zone": zone,
                }
                volumes[key] = {"boot": False, "volume_type": "sbs_volume", "id": vid, "zone": zone}
            mac = next(self._mac)
            data = {
                "id": sid,
                "name": body.get("name"),
                "hostname": body.get("name"),
                "commercial_type": ctype,
                "state": "stopped",
                "state_detail": "",
                "zone": zone,
                "organization": project,
                "project": project,
                "tags": list(body.get("tags") or []),
                "creation_date": _now(),
                "modification_date": _now(),
                "allowed_actions": STOPPED_ACTIONS,
                "dynamic_ip_required": body.get("dynamic_ip_required", True),
                "routed_ip_enabled": True,
                "enable_ipv6": False,
                "protected": False,
                "arch": "x86_64",
                "boot_type": "local",
                "image": {"id": body.get("image"), "name": body.get("image")},
                "public_ip": None,
                "public_ips": [],
                "private_ip": None,
                "ipv6": None,
                "mac_address": f"de:00:00:00:{mac // 256:02x}:{mac % 256:02x}",
                "volumes": volumes,
                "maintenances": [],
                "security_group": {"id": group["id"], "name": group["name"]}
                if group
                else {"id": "default", "name": "Default security group"},
                "placement_group": None,
                "private_nics": [],
                "filesystems": [],
                "location": None,
                "end_of_service": False,
            }
            self.servers[sid] = _Server(data, seq=mac)
            self.events.append(("create", zone, sid))
            return self._json(
                {"server": data},
                201,
                headers={"Location": f"/instance/v1/zones/{zone}/servers/{sid}"},
            )

    def _h_server(self, request: Request, zone: str, sid: str) -> Response:
        with self.lock:
            srv = self._get(zone, sid)
            ctype = srv.data["commercial_type"] if srv else None
        op = "delete_server" if request.method == "DELETE" else "get_server"
        if (f := self._fault(op, zone, ctype)) is not None and isinstance(f, Response):
            return f
        with self.lock:
            if srv is None or sid not in self.servers:
                return self._not_found(sid)
            if request.method == "DELETE":
                if srv.data["state"] != "stopped":
                    return self._error(
                        400, "invalid_request_error", "instance must be stopped to be deleted"
                    )
                self.events.append(("delete", zone, sid))
                self._remove(srv, terminated=False)
            else:
                return self._json({"server": srv.data})
        if self.host is not None:
            self.host.power_off(sid)
        return Response(status=204)

    def _h_action(self, request: Request, zone: str, sid: str) -> Response:
        body = request.get_json(force=True, silent=True) or {}
        action = body.get("action", "poweron")
        with self.lock:
            srv = self._get(zone, sid)
            if srv is None:
                return self._not_found(sid)
            ctype = srv.data["commercial_type"]
        fault = self._fault(action, zone, ctype)
        if isinstance(fault, Response):
            return fault
        with self.lock:
            if sid not in self.servers:
                return self._not_found(sid)
            if action not in srv.data["allowed_actions"]:
                if srv.data["state"] in _TRANSIENT:
                    return self._error(
                        409,
                        "transient_state",
                        "resource is in a transient state",
                        resource="instance_server",
                        resource_id=sid,
                        current_state=srv.data["state"],
                    )
                return self._error(
                    400,
                    "invalid_request_error",
                    f"action {action} is not allowed in state {srv.data['state']}",
                )
            self.events.append((action, zone, sid))
            boots: dict[str, bytes] | None = None
            if action == "poweron":
                srv.data.update(
                    state="starting",
                    state_detail="provisioning node",
                    allowed_actions=STARTING_ACTIONS,
                )
                dynamic = {
                    "id": str(uuid.uuid4()),
                    "address": f"51.15.0.{len(self.events) % 250}",
                    "dynamic": True,
                    "family": "inet",
                    "gateway": "62.210.0.1",
                    "netmask": "32",
                    "provisioning_mode": "dhcp",
                    "state": "attached",
                    "tags": [],
                    "ipam_id": str(uuid.uuid4()),
                }
                srv.data["public_ips"].append(dynamic)
                if isinstance(fault, Fault) and fault.kind == "attach_flexible_ip":
                    srv.data["public_ips"].append(self._flexible_ip(zone, srv))
                srv.data["public_ip"] = srv.data["public_ips"][0]
                kind = fault.kind if isinstance(fault, Fault) else None
                if kind == "never_start":
                    srv.pending = None
                elif kind == "lagging_poweron":
                    srv.data.update(
                        state="stopped", state_detail="", allowed_actions=STOPPED_ACTIONS
                    )
                    srv.pending = ("starting", self.boot_observations)
                elif kind == "stock_after_poweron":
                    srv.pending = ("out of stock", self.boot_observations)
                else:
                    srv.pending = ("running", self.boot_observations)
                    boots = dict(srv.user_data)
            elif action == "terminate":
                srv.data.update(state="stopping", allowed_actions=[])
                srv.pending = ("gone", self.stop_observations)
            elif action == "poweroff":
                srv.data.update(state="stopping", allowed_actions=[])
                srv.pending = ("stopped", self.stop_observations)
            elif action == "stop_in_place":
                srv.data.update(state="stopping", allowed_actions=[])
                srv.pending = ("stopped in place", self.stop_observations)
            task = {
                "id": str(uuid.uuid4()),
                "description": f"server_{action}",
                "status": "pending",
                "href_from": f"/servers/{sid}/action",
                "href_result": f"/servers/{sid}",
                "started_at": _now(),
                "terminated_at": None,
                "progress": 0,
                "zone": zone,
            }
        # Outside the lock: starting or stopping what runs on the server takes a while.
        if self.host is not None and boots is not None:
            self.host.power_on(sid, boots)
        elif self.host is not None and action in ("terminate", "poweroff", "stop_in_place"):
            self.host.power_off(sid)
        return self._json({"task": task}, 202)

    def _flexible_ip(self, zone: str, srv: _Server) -> dict[str, Any]:
        iid = str(uuid.uuid4())
        self.ips[iid] = {
            "id": iid,
            "address": f"51.158.0.{len(self.ips) + 1}",
            "prefix": None,
            "reverse": None,
            "server": {"id": srv.data["id"], "name": srv.data["name"]},
            "organization": self.project_id,
            "project": self.project_id,
            "zone": zone,
            "type": "routed_ipv4",
            "state": "attached",
            "tags": list(srv.data["tags"]),
            "ipam_id": str(uuid.uuid4()),
        }
        return {
            "id": iid,
            "address": self.ips[iid]["address"],
            "dynamic": False,
            "family": "inet",
            "gateway": "62.210.0.1",
            "netmask": "32",
            "provisioning_mode": "dhcp",
            "state": "attached",
            "tags": [],
            "ipam_id": self.ips[iid]["ipam_id"],
        }

    def _h_ud_list(self, request: Request, zone: str, sid: str) -> Response:
        with self.lock:
            srv = self._get(zone, sid)
            if srv is None:
                return self._not_found(sid)
            return self._json({"user_data": sorted(srv.user_data)})

    def _h_ud(self, request: Request, zone: str, sid: str, key: str) -> Response:
        with self.lock:
            srv = self._get(zone, sid)
            ctype = srv.data["commercial_type"] if srv else None
        if (f := self._fault("user_data", zone, ctype)) is not None and isinstance(f, Response):
            return f
        with self.lock:
            if srv is None or sid not in self.servers:
                return self._not_found(sid)
            if request.method == "PATCH":
                srv.user_data[key] = request.get_data()
                self.events.append(("user_data", zone, sid))
                return Response(status=204)
            if request.method == "DELETE":
                srv.user_data.pop(key, None)
                return Response(status=204)
            if key not in srv.user_data:
                return self._not_found(key, "user_data")
            return Response(srv.user_data[key], content_type="text/plain")

    # -- catalog ----------------------------------------------------------------------------

    def _h_types(self, request: Request, zone: str) -> Response:
        items = sorted(CATALOG[zone].items())
        page, headers = self._page(request, items)
        return self._json(
            {
                "servers": {
                    name: {"hourly_price": price, "gpu": 1, "arch": "x86_64"}
                    for name, price in page
                }
            },
            headers=headers,
        )

    def _h_availability(self, request: Request, zone: str) -> Response:
        if (f := self._fault("availability", zone, None)) is not None and isinstance(f, Response):
            return f
        items = sorted(CATALOG[zone])
        page, headers = self._page(request, items)
        with self.lock:
            body = {
                name: {"availability": self.availability.get((zone, name), "available")}
                for name in page
            }
        return self._json({"servers": body}, headers=headers)

    def _h_groups(self, request: Request, zone: str) -> Response:
        with self.lock:
            items = [g for g in self.security_groups.values() if g["zone"] == zone]
        page, headers = self._page(request, items)
        return self._json({"security_groups": page}, headers=headers)

    def _h_group(self, request: Request, zone: str, gid: str) -> Response:
        with self.lock:
            group = self.security_groups.get(gid)
        if group is None or group["zone"] != zone:
            return self._not_found(gid, "instance_security_group")
        return self._json({"security_group": group})

    # -- IPs and volumes --------------------------------------------------------------------

    def _h_ips(self, request: Request, zone: str) -> Response:
        if request.method == "POST":
            return self._error(400, "invalid_request_error", "not emulated")
        if (f := self._fault("list_ips", zone, None)) is not None and isinstance(f, Response):
            return f
        wanted = [t for t in (request.args.get("tags") or "").split(",") if t]
        with self.lock:
            items = [
                ip
                for ip in self.ips.values()
                if ip["zone"] == zone and all(t in ip["tags"] for t in wanted)
            ]
        page, headers = self._page(request, items)
        return self._json({"ips": page}, headers=headers)

    def _h_ip(self, request: Request, zone: str, ip: str) -> Response:
        if request.method == "DELETE" and (
            (f := self._fault("delete_ip", zone, None)) is not None and isinstance(f, Response)
        ):
            return f
        with self.lock:
            found = next(
                (
                    v
                    for v in self.ips.values()
                    if v["zone"] == zone and ip in (v["id"], v["address"])
                ),
                None,
            )
            if found is None:
                return self._not_found(ip, "instance_ip")
            if request.method == "DELETE":
                del self.ips[found["id"]]
                for srv in self.servers.values():  # a deleted IP leaves its server
                    srv.data["public_ips"] = [
                        p for p in srv.data["public_ips"] if p["id"] != found["id"]
                    ]
                self.events.append(("delete_ip", zone, found["id"]))
                return Response(status=204)
            return self._json({"ip": found})

    def _h_instance_volumes(self, request: Request, zone: str) -> Response:
        with self.lock:
            items = [v for v in self.local_volumes.values() if v["zone"] == zone]
        page, headers = self._page(request, items)
        return self._json({"volumes": page}, headers=headers)

    def _h_instance_volume(self, request: Request, zone: str, vid: str) -> Response:
        with self.lock:
            vol = self.local_volumes.get(vid)
            if vol is None or vol["zone"] != zone:
                return self._not_found(vid, "instance_volume")
            if request.method == "DELETE":
                if vol["server"] is not None:
                    return self._error(
                        400, "invalid_request_error", "a volume attached to a server"
                    )
                del self.local_volumes[vid]
                self.events.append(("delete_local_volume", zone, vid))
                return Response(status=204)
            return self._json({"volume": vol})

    def _h_block_volumes(self, request: Request, zone: str) -> Response:
        product = request.args.get("product_resource_id")
        with self.lock:
            items = [
                v
                for v in self.volumes.values()
                if v["zone"] == zone
                and v["status"] != "deleted"
                and (
                    product is None
                    or any(r["product_resource_id"] == product for r in v["references"])
                )
            ]
        page, headers = self._page(request, items, size_param="page_size")
        return self._json({"volumes": page, "total_count": len(items)})

    def _h_block_volume(self, request: Request, zone: str, vid: str) -> Response:
        op = "delete_volume" if request.method == "DELETE" else "get_volume"
        if (f := self._fault(op, zone, None)) is not None and isinstance(f, Response):
            return f
        with self.lock:
            vol = self.volumes.get(vid)
            if vid in self._deleting and request.method == "GET":
                if self._deleting[vid] <= 0:
                    del self._deleting[vid], self.volumes[vid]
                    vol = None
                else:
                    self._deleting[vid] -= 1
            if vol is None or vol["zone"] != zone or vol["status"] == "deleted":
                return self._not_found(vid, "volume")
            if request.method == "DELETE":
                if vol["status"] != "available":
                    return self._error(
                        409,
                        "precondition_failed",
                        "volume is attached",
                        resource="volume",
                        resource_id=vid,
                    )
                self.events.append(("delete_volume", zone, vid))
                if self.volume_deleting_reads > 0:
                    vol.update(status="deleting", updated_at=_now())
                    self._deleting[vid] = self.volume_deleting_reads
                else:
                    del self.volumes[vid]
                return Response(status=204)
            return self._json(vol)
