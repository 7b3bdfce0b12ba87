#!/usr/bin/env bash
# Run a command (the local stack of `make up` / `make demo`) with a Redis of its own.
#
# The stack never writes into a Redis it did not start unless the operator names one: with
# MURMUR_REDIS_URL (or MURMUR_REDIS_URL_FILE, MURMUR_REDIS_SENTINELS, or a redis_url in the
# MURMUR_CONFIG file) that Redis is used; otherwise a private redis-server is started on a free
# loopback port, its files under var/redis/, MURMUR_REDIS_URL is set to it for the command
# (and written to var/stack.env for the tools run beside it: make flower, murmur fleet), and
# it is stopped when the command ends. Another application's Redis on 6379 (another
# Celery app, a cache) is left alone: its FLUSHDB cannot wipe Murmur's queues, and Murmur's
# keys never mix with its own. Debian's redis-server is installed when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
var="${MURMUR_STACK_VAR:-$PWD/var}"
# Only looked at, never written: where a machine's shared Redis usually answers, so the
# stack can say that it leaves it alone.
shared="${MURMUR_STACK_SHARED_REDIS:-redis://127.0.0.1:6379/0}"

ping() {
  "$py" -c "import redis,sys; redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1, socket_timeout=1).ping()" "$1" 2>/dev/null
}
host_port() {  # redis://user:pw@host:port/db -> host:port
  local hp="${1#*://}"; hp="${hp##*@}"; hp="${hp%%/*}"
  case "$hp" in *:*) echo "$hp";; *) echo "$hp:6379";; esac
}
need_redis_server() {
  if ! command -v redis-server >/dev/null; then
    echo "installing Debian's redis-server…"
    local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq redis-server >/dev/null
  fi
}

pidfile=""
stack_env=""
stop_redis() {
  [ -z "$stack_env" ] || rm -f "$stack_env"
  if [ -n "$pidfile" ] && [ -f "$pidfile" ]; then
    local pid; pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$pidfile"
  fi
}
trap stop_redis EXIT

# start_redis PORT: a redis-server on 127.0.0.1:PORT, files under $var/redis; 0 once it answers
start_redis() {
  local port="$1" dir="$var/redis"
  mkdir -p "$dir"; chmod 700 "$var" "$dir" 2>/dev/null || true
  pidfile="$dir/redis-$port.pid"  # per port: two stacks in one checkout keep theirs
  redis-server --bind 127.0.0.1 --port "$port" --daemonize yes --save "" --appendonly no \
    --maxmemory-policy noeviction --dir "$dir" --pidfile "$pidfile" \
    --logfile "$dir/redis.log" || return 1
  for _ in $(seq 50); do ping "redis://127.0.0.1:$port/0" && return 0; sleep 0.1; done
  return 1
}

named="$("$py" -m scripts.stack named-redis)"
if [ -n "$named" ]; then
  url="${MURMUR_REDIS_URL:-}"
  if [ -z "$url" ] || ping "$url"; then
    echo "using the Redis you named ($named)"
  else
    hp="$(host_port "$url")"; host="${hp%:*}"; port="${hp##*:}"
    case "$host" in 127.0.0.1|localhost) ;; *) echo "no Redis answers at $hp (MURMUR_REDIS_URL)" >&2; exit 1;; esac
    need_redis_server
    start_redis "$port" || { echo "redis-server did not start on $hp; see $var/redis/redis.log" >&2; exit 1; }
    echo "started a Redis on $hp, where MURMUR_REDIS_URL names one (stopped when this ends)"
  fi
else
  need_redis_server
  started=""
  for _ in 1 2 3; do  # a free port can be taken between the look and the bind: try another
    port="$("$py" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")"
    if start_redis "$port"; then started=1; break; fi
    stop_redis; pidfile=""
  done
  [ -n "$started" ] || { echo "redis-server did not start; see $var/redis/redis.log" >&2; exit 1; }
  export MURMUR_REDIS_URL="redis://127.0.0.1:$port/0"
  # For the tools run beside the stack (make flower, murmur fleet): where its Redis is, while
  # it runs. Owner-only, like the rest of var/.
  stack_env="$var/stack.env"
  (umask 077; echo "MURMUR_REDIS_URL=$MURMUR_REDIS_URL" > "$stack_env")
  echo "started a private Redis on 127.0.0.1:$port, files in $var/redis/ (stopped when this ends)"
  if ping "$shared"; then
    echo "  (the Redis at $(host_port "$shared") is left alone; MURMUR_REDIS_URL=$shared uses it instead)"
  fi
fi

# Run the command in the background so a Ctrl-C or a TERM reaching this script is passed on
# as TERM: the stack then stops everything it started before Redis goes away.
"$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' INT TERM
# A trapped signal ends `wait` early (status 128+signal) while the child is still stopping:
# wait again for its own status (a child that has exited stays waitable until reaped).
set +e
wait "$child"
status=$?
while kill -0 "$child" 2>/dev/null; do
  wait "$child"
  status=$?
done
exit "$status"
