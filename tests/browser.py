"""Headless Chromium for the tests of the report and the live dashboard: the browser's
path (None when it is not installed), a run of it, and a probe script that records what a
page failed to load and how many resources it fetched."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None
)
SKIP_REASON = "chromium is not installed (.ci/run installs it)"

#: Put first in a copy of a page: records script errors, console errors and resources
#: fetched into attributes of <html>, which --dump-dom shows.
PROBE = """<script>
(function () {
  var root = document.documentElement, errors = [];
  function note(text) {
    errors.push(String(text));
    root.setAttribute('data-errors', errors.join(' | '));
  }
  window.addEventListener('error', function (e) {
    var target = e.target && (e.target.src || e.target.href);
    note(e.message || ('failed to load ' + target));
  }, true);
  var error = console.error;
  console.error = function () {
    note(Array.prototype.join.call(arguments, ' '));
    error.apply(console, arguments);
  };
  window.addEventListener('load', function () {
    root.setAttribute('data-loaded', '1');
    var fetched = performance.getEntriesByType('resource').length;
    root.setAttribute('data-resources', String(fetched));
  });
})();
</script>"""


def chromium(tmp_path: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """Chromium run headless over ``args`` (a URL last), its own profile in ``tmp_path``,
    none of its background requests."""
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def probed(tmp_path: Path, text: str, name: str) -> str:
    """A copy of the page ``text`` with ``PROBE`` first, written to ``tmp_path / name``:
    its file URL."""
    path = tmp_path / name
    path.write_text(text.replace("<head>", "<head>" + PROBE, 1))
    return path.as_uri()
