"""The wire contract between the control plane and a worker: one definition, both sides import it.

Everything two processes must agree on lives here and only here: the Celery task and queue
names, the job a claim returns, the transcript or failure a worker posts, the usage report
and its closed set of missing-reading reasons, the log caps and redaction, report timing, the
runtime settings a profile names and the CTranslate2 compute-type rule, the readiness report.
docs/worker-protocol.md and docs/observability.md describe the same contract in prose.

Invariants:
- Pure pydantic and the standard library: no torch, faster-whisper, numpy, Celery or Flask
  import, so the control image (which copies `gpu_worker/` for this package) and the worker
  image load it alike, and importing it costs nothing.
- No copy anywhere else: `app/`, `tasks/` and the rest of `gpu_worker/` import from here. A
  rule that changes changes on both sides at once; an older peer is what tolerance is for.
- Modules: `broker` (task name, queue names, profile names, visibility timeout); `claim`
  (the claimed job, the default audio limit); `transcript` (the result body); `failure`
  (failure codes and body); `usage` (the usage report, log caps, report timing);
  `redaction` (what a log line may carry); `runtime` (the settings a worker runs with and
  reports at readiness, compute types per device, drain timeout, exit status); `readiness`
  (the runtime report a worker posts once its model is loaded).
"""
