"""Command line: `python -m gpu_worker check | run | verify-assets`.

check          validate the runtime from the environment (profile, hardware, model files),
               print the diagnostics as JSON; exit 0 if this machine can run it, 1 if not.
run            the same checks (identity variables required), then load the model, report
               ready and consume `transcribe.<MURMUR_PROFILE>` until SIGTERM.
verify-assets  check the named manifest assets (all by default) against their checksums;
               the image build runs it so a bad download fails the build, not a boot.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from gpu_worker.manifest import (
    AssetNotInstalled,
    AssetVerificationError,
    ManifestError,
    load_manifest,
    verify_asset,
)
from gpu_worker.preflight import PreflightError, run_preflight

EXIT_OK = 0
EXIT_CANNOT_RUN = 1

log = logging.getLogger("gpu_worker")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_worker", description="Murmur transcription worker"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="validate the runtime and print diagnostics as JSON")
    run = commands.add_parser("run", help="check, load the model, report ready, serve jobs")
    run.add_argument("--loglevel", default="INFO")
    verify = commands.add_parser("verify-assets", help="verify manifest assets by checksum")
    verify.add_argument("names", nargs="*", help="asset names (default: all)")
    args = parser.parse_args(argv)

    if args.command == "check":
        return _check()
    if args.command == "verify-assets":
        return _verify_assets(args.names)
    return _run(args.loglevel)


def _check() -> int:
    try:
        preflight = run_preflight(os.environ, require_identity=False)
    except (PreflightError, ManifestError) as exc:
        diagnostics = exc.diagnostics if isinstance(exc, PreflightError) else {}
        print(json.dumps({"ok": False, "problems": str(exc).splitlines(), **diagnostics}, indent=2))
        print(f"this machine cannot run the runtime:\n{exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    print(json.dumps({"ok": True, "problems": [], **preflight.runtime().to_json()}, indent=2))
    return EXIT_OK


def _run(loglevel: str) -> int:
    logging.basicConfig(
        level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        preflight = run_preflight(os.environ, require_identity=True)
    except (PreflightError, ManifestError) as exc:
        print(f"worker cannot start:\n{exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    # Imported here: `check` must not pay for Celery.
    from gpu_worker.service import serve

    return serve(preflight, loglevel=loglevel.upper())


def _verify_assets(names: Sequence[str]) -> int:
    try:
        manifest = load_manifest()
        assets = [manifest.asset(name) for name in names] or list(manifest.assets.values())
    except ManifestError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CANNOT_RUN
    failed = False
    for asset in assets:
        try:
            verified = verify_asset(asset)
        except (AssetNotInstalled, AssetVerificationError) as exc:
            print(f"FAIL {exc}")
            failed = True
            continue
        print(f"ok   {asset.name}: {verified.bytes_verified} bytes under {verified.root}")
    return EXIT_CANNOT_RUN if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
