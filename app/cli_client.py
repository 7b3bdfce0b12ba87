"""How the `murmur` client commands reach the API: its address, the token, one-line errors.

The address is `MURMUR_URL`, else `http://MURMUR_HOST:MURMUR_PORT` (the variables `murmur api`
and `make up` serve on; a wildcard host is reached on the loopback address), else
`http://127.0.0.1:8000`. The token is the first of `MURMUR_API_TOKEN` (comma-separated, as the
API reads it), else of the file `MURMUR_API_TOKEN_FILE` names.

Every failure is one line on stderr and exit status 1, never a traceback: the API's own
`{"error": {"code", "message"}}` as `STATUS code: message`, an API that does not answer as
where the client looked and which variables move it, a missing token as what to set. The
token is never printed, and the address is shown without any credentials it carries.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import click
import requests

# Connect, then read: a submission's upload may take long, the API answers at once after it.
TIMEOUT = (5.0, 600.0)
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = "8000"
_WILDCARDS = ("", "0.0.0.0", "::", "[::]")  # noqa: S104 (addresses to serve on, not to call)


class CliError(click.ClickException):
    """A client command's failure: one line, `murmur: ...`, exit status 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"murmur: {self.format_message()}", err=True, file=file)


def api_url(env: Mapping[str, str] | None = None) -> str:
    """Where the API answers, from MURMUR_URL or MURMUR_HOST/MURMUR_PORT."""
    env = os.environ if env is None else env
    if env.get("MURMUR_URL"):
        return env["MURMUR_URL"].rstrip("/")
    host = env.get("MURMUR_HOST", "").strip()
    host = DEFAULT_HOST if host in _WILDCARDS else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address in a URL
    port = env.get("MURMUR_PORT", "").strip() or DEFAULT_PORT
    return f"http://{host}:{port}"


def shown_url(url: str) -> str:
    """The URL without a user or password in it."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def api_token(env: Mapping[str, str] | None = None) -> str:
    """The first API token of MURMUR_API_TOKEN, else of MURMUR_API_TOKEN_FILE's file."""
    env = os.environ if env is None else env
    raw = env.get("MURMUR_API_TOKEN", "")
    if not raw.strip() and env.get("MURMUR_API_TOKEN_FILE"):
        path = env["MURMUR_API_TOKEN_FILE"]
        try:
            raw = Path(path).read_text()
        except OSError as exc:
            raise CliError(f"cannot read MURMUR_API_TOKEN_FILE ({path}): {exc.strerror}") from None
    token = raw.split(",")[0].strip()
    if not token:
        raise CliError(
            "no API token: set MURMUR_API_TOKEN (or MURMUR_API_TOKEN_FILE, a file holding it) "
            "to one of the API's tokens"
        )
    return token


def _reason(exc: BaseException) -> str:
    """What the operating system said about a failed connection ('Connection refused')."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 20:
        current = todo.pop(0)
        if current is None or current in seen:
            continue
        seen.append(current)
        if isinstance(current, OSError) and current.strerror:
            return str(current.strerror)
        todo += [getattr(current, "reason", None), current.__cause__, current.__context__]
        todo += [a for a in current.args if isinstance(a, BaseException)]
    return type(exc).__name__


@dataclass
class ApiClient:
    url: str
    token: str

    @classmethod
    def from_env(cls) -> ApiClient:
        return cls(api_url(), api_token())

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | tuple[float, float] = TIMEOUT,
        **kwargs: Any,
    ) -> requests.Response:
        """The API's answer to a request; an error answer or no answer is a CliError."""
        try:
            response = requests.request(
                method,
                self.url + path,
                headers={**self.headers, **(headers or {})},
                timeout=timeout,
                **kwargs,
            )
        except requests.Timeout:
            raise CliError(f"the API at {shown_url(self.url)} did not answer in time") from None
        except requests.RequestException as exc:
            raise CliError(
                f"cannot reach the API at {shown_url(self.url)}: {_reason(exc)} (is it running? "
                "set MURMUR_URL, or MURMUR_HOST and MURMUR_PORT)"
            ) from None
        if response.status_code >= 400:
            raise CliError(error_line(response))
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise CliError(
                f"the API answered {method} {path} with something that is not JSON "
                f"(HTTP {response.status_code}); is MURMUR_URL the API?"
            ) from None


def error_line(response: requests.Response) -> str:
    """`STATUS code: message` from the API's error body, or the bare status without one."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "code" in error:
        return f"{response.status_code} {error['code']}: {error.get('message', '')}"
    return f"HTTP {response.status_code} {response.reason} (not an answer of Murmur's API?)"


class MultipartUpload:
    """A multipart body read from disk lazily, with a known length and a progress callback.

    Deliberately not an io class: requests would probe tell() and fall back to chunked encoding.
    """

    def __init__(self, path: Path, fields: dict[str, str], progress: Callable[[int], Any]) -> None:
        self.boundary = uuid.uuid4().hex
        head = b""
        for name, value in fields.items():
            head += (
                f'--{self.boundary}\r\nContent-Disposition: form-data; name="{name}"'
                f"\r\n\r\n{value}\r\n"
            ).encode()
        filename = path.name.replace('"', "").replace("\r", "").replace("\n", "")
        head += (
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        tail = f"\r\n--{self.boundary}--\r\n".encode()
        self._parts: list[IO[bytes]] = [io.BytesIO(head), path.open("rb"), io.BytesIO(tail)]
        self._length = len(head) + path.stat().st_size + len(tail)
        self._progress = progress

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def __len__(self) -> int:
        return self._length

    def read(self, size: int = -1) -> bytes:
        out = b""
        while self._parts and (size < 0 or len(out) < size):
            chunk = self._parts[0].read(-1 if size < 0 else size - len(out))
            if not chunk:
                self._parts.pop(0).close()
                continue
            out += chunk
        self._progress(len(out))
        return out

    def close(self) -> None:
        for part in self._parts:
            part.close()
        self._parts = []
