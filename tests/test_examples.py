"""The examples run as a reader runs them (``python examples/NAME.py`` from wherever they
are), and leave nothing in the directory they were started from (issue 36, "The first
hour, again"). ``examples/slurm_pool.py`` without Slurm is in test_command_lines.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from as_a_user import run_script

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.timeout(180)
def test_the_report_example_writes_to_a_directory_it_names_not_the_current_one(tmp_path):
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    done = run_script(EXAMPLES / "report.py", cwd, tmp_path, timeout=150)
    assert done.returncode == 0, done.stderr
    assert list(cwd.iterdir()) == []
    printed = {
        line.split(": ", 1)[0]: Path(line.split(": ", 1)[1])
        for line in done.stdout.splitlines()
        if ": " in line
    }
    report = printed["report"]
    # a new directory under the temporary one ($TMPDIR), holding the three files
    assert report.parent.parent == tmp_path / "tmp", done.stdout
    assert sorted(os.listdir(report.parent)) == ["run-again.html", "run.html", "run.jsonl"]
    assert printed["event log"] == report.parent / "run.jsonl"
    assert printed["rebuilt from the event log"] == report.parent / "run-again.html"
    for page in (report, printed["rebuilt from the event log"]):
        assert page.read_text().lstrip().lower().startswith("<!doctype html"), page
