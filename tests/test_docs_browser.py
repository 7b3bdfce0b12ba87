"""/docs in a real browser: headless Chromium (Debian's `chromium`) loads the page with every
host but 127.0.0.1 unresolvable, so it renders only if everything it needs comes from the API,
under the page's Content-Security-Policy. Skipped where Chromium is not installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import LiveApi

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: chromium)"),
]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_docs_page_renders_offline_in_a_browser(live_api: LiveApi, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    shown = subprocess.run(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            # No CDN, no online validator: any other host fails to resolve.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=15000",
            "--dump-dom",
            f"{live_api.url}/docs",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    dom = shown.stdout
    # Swagger UI built the operations from /openapi.json.
    for path in ("/v1/jobs", "/v1/audio/transcriptions", "/asr", "/detect-language"):
        assert f'data-path="{path}"' in dom, path
    assert "Content Security Policy" not in shown.stderr
