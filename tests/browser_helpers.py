"""Headless Chromium for the tests that check an HTML report in a real browser (each skips
with a reason where none is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

NO_BROWSER = "no Chromium installed (apt-get install -y chromium; .ci/run does)"


def chromium() -> str | None:
    """The first Chromium-like browser on PATH, None if there is none."""
    return next(
        (p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))),
        None,
    )


def browser_flags(profile: Path) -> list[str]:
    """A headless run with its own profile folder; skips the test where no browser is found."""
    browser = chromium()
    if browser is None:
        pytest.skip(NO_BROWSER)
    return [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1200,1800",
    ]


def rendered_dom(page: Path, profile: Path) -> str:
    """The page's DOM once its scripts ran (``--dump-dom``)."""
    return subprocess.run(
        [*browser_flags(profile), "--dump-dom", page.resolve().as_uri()],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
