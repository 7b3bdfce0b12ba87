#!/usr/bin/env bash
# Run a command with a Redis answering at $MURMUR_REDIS_URL: use the one there, or start a
# private one (installing Debian's redis-server if missing) and stop it when the command ends.
set -euo pipefail
cd "$(dirname "$0")/.."
url="${MURMUR_REDIS_URL:-redis://127.0.0.1:6379/0}"
py="${PYTHON:-.venv/bin/python}"

ping() {
  "$py" -c "import redis,sys; redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1).ping()" "$url" 2>/dev/null
}

started=""
if ping; then
  echo "using the Redis at ${url#*@}"  # the part after any credentials
else
  host_port="${url#*://}"; host_port="${host_port#*@}"; host_port="${host_port%%/*}"
  host="${host_port%%:*}"; port="${host_port##*:}"; [ "$port" = "$host_port" ] && port=6379
  case "$host" in 127.0.0.1|localhost) ;; *) echo "no Redis answers at $host_port" >&2; exit 1;; esac
  if ! command -v redis-server >/dev/null; then
    echo "installing Debian's redis-server…"
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq redis-server >/dev/null
  fi
  mkdir -p var
  redis-server --bind 127.0.0.1 --port "$port" --daemonize yes --save "" --appendonly no \
    --maxmemory-policy noeviction --dir "$PWD/var" --pidfile "$PWD/var/redis.pid" \
    --logfile "$PWD/var/redis.log"
  for _ in $(seq 50); do ping && break; sleep 0.1; done
  ping || { echo "redis-server did not start; see var/redis.log" >&2; exit 1; }
  started=1
  echo "started a private Redis on 127.0.0.1:$port (stopped when this ends)"
fi

stop_redis() {
  if [ -n "$started" ] && [ -f var/redis.pid ]; then
    kill "$(cat var/redis.pid)" 2>/dev/null || true
    rm -f var/redis.pid
  fi
}
trap stop_redis EXIT
# Run the command in the background so a Ctrl-C or a TERM reaching this script is passed on
# as TERM: the stack then stops everything it started before Redis goes away.
"$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' INT TERM
status=0
wait "$child" || status=$?
while kill -0 "$child" 2>/dev/null; do wait "$child" || status=$?; done
exit "$status"
