"""The wire contract between the control plane and a worker: one definition, both sides import it.

Everything two processes must agree on lives here and only here: the Celery task and queue
names and each queue's in-flight keys, the internal routes, the job a claim returns, the
transcript or failure a worker posts, the finite number types every body uses, the usage
report and its closed set of missing-reading reasons, the log caps and redaction, report
timing, the worker's environment variable names, the runtime settings a profile names (device,
compute type, VAD, alignment) with the CTranslate2 compute-type rule and the alignment rule,
the readiness report.
docs/worker-protocol.md and docs/observability.md describe the same contract in prose.

Invariants:
- Pure pydantic and the standard library: no torch, faster-whisper, numpy, Celery or Flask
  import, so the control image (which copies `gpu_worker/` for this package) and the worker
  image load it alike, and importing it costs nothing.
- No copy anywhere else: `app/`, `tasks/` and the rest of `gpu_worker/` import from here. A
  rule that changes changes on both sides at once; an older peer is what tolerance is for.
- Shared code that is not contract stays outside: gpu_worker/broker_tls.py (how any client
  verifies a `rediss://` broker; each side applies it on its own, nothing on the wire
  depends on the other's copy) and gpu_worker/decoding.py (the PyAV decode loop the probe
  and the worker share; it imports `av`, so it cannot live here).
- Modules: `broker` (task name, queue names, profile names, visibility timeout, in-flight
  keys); `routes` (the internal paths a worker calls, and their Flask rule form); `claim`
  (the claimed job, the default audio limit); `transcript` (the transcript and the result
  body, `ResultBody`); `failure` (failure codes, `CANCELLED`, and the failure body);
  `bounds` (finite, bounded number types); `usage` (the usage report, log caps, report
  timing); `redaction` (what a log line may carry); `environment` (the names of the
  variables the control plane writes and the worker reads); `runtime` (the devices, compute
  types, VAD backends and alignment devices a worker runs with and reports at readiness, the
  capability rule and its words, the alignment rule, drain timeout, exit status);
  `readiness` (the runtime report a worker posts once its model is loaded, and its body,
  `ReadyBody`).
"""
