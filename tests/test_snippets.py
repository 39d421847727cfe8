"""Every ```python block of README.md and docs/*.md runs as written (issue 36, "The first
hour, again"): each in a process of its own, from an empty directory, with this checkout's
package, a home under the test's ``tmp_path`` (``~`` and connection files land there) and a
time limit. A block must define what it uses: a local ``Manager`` with its workers, small
data.

A block that cannot run here (it submits batch jobs, needs coffea, waits for workers on
other nodes) says so on the line just above its fence, with its reason::

    <!-- not run: submits Slurm jobs -->
    ```python

Such a block shows as skipped with that reason. A marker without a reason, or one that is
not just above a python block, fails ``test_every_not_run_marker_gives_a_reason``.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from as_a_user import run_script

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<lang>[\w+-]*)")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run:(?P<reason>.*?)-->\s*$")
#: a line that looks meant as a marker (one quoted inside a sentence is not)
_MARKER_LIKE = re.compile(r"^\s*<!--\s*not[ -]?run", re.IGNORECASE)


@dataclass(frozen=True)
class Block:
    """A fenced python block of a page."""

    page: str  #: its path, relative to the repository
    line: int  #: of its opening fence, from 1
    code: str  #: dedented to its fence
    not_run: str | None  #: the marker's reason, stripped ("" when it gives none); None: runs


def python_blocks(text: str, page: str) -> tuple[list[Block], list[str]]:
    """The python blocks of ``text``, and the problems with its ``not run`` markers."""
    lines = text.splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    used: set[int] = set()  # lines of markers that precede a python block
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence[0] * len(fence)):
            end += 1
        if opening["lang"] == "python":
            above = i - 1
            while above >= 0 and not lines[above].strip():
                above -= 1
            marker = _NOT_RUN.match(lines[above]) if above >= 0 else None
            if marker:
                used.add(above)
            body = "\n".join(line[indent:] for line in lines[i + 1 : end])
            reason = marker["reason"].strip() if marker else None
            blocks.append(Block(page, i + 1, textwrap.dedent(body) + "\n", reason))
        i = end + 1
    for number, line in enumerate(lines):
        if _MARKER_LIKE.search(line):
            marker = _NOT_RUN.match(line)
            if marker is None:
                problems.append(f"{page}:{number + 1}: not a marker: {line.strip()!r}")
            elif not marker["reason"].strip():
                problems.append(f"{page}:{number + 1}: a 'not run' marker gives no reason")
            elif number not in used:
                problems.append(f"{page}:{number + 1}: a 'not run' marker not above a python block")
    return blocks, problems


def _all_blocks() -> tuple[list[Block], list[str]]:
    blocks: list[Block] = []
    problems: list[str] = []
    for path in PAGES:
        found, wrong = python_blocks(path.read_text(), str(path.relative_to(ROOT)))
        blocks += found
        problems += wrong
    return blocks, problems


BLOCKS, PROBLEMS = _all_blocks()


def _params() -> list:
    params = []
    for block in BLOCKS:
        marks = [pytest.mark.skip(reason=f"not run: {block.not_run}")] if block.not_run else []
        params.append(pytest.param(block, id=f"{block.page}:{block.line}", marks=marks))
    return params


# -- the blocks, run ---------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.timeout(150)
@pytest.mark.parametrize("block", _params())
def test_the_python_block_runs_as_written(block: Block, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(block.code)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done = run_script(script, cwd, tmp_path, timeout=120)
    assert done.returncode == 0, f"{block.page}:{block.line}\n{block.code}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr


def test_every_not_run_marker_gives_a_reason():
    assert PROBLEMS == []
    assert [b for b in BLOCKS if b.not_run == ""] == []


def test_the_blocks_of_the_readme_and_the_docs_are_found():
    pages = {block.page for block in BLOCKS}
    assert "README.md" in pages and "docs/getting-started.md" in pages, pages


# -- the reader of pages, on literals ----------------------------------------------------


def test_blocks_are_found_with_their_markers_and_indentation():
    text = textwrap.dedent(
        """\
        # A page
        Mark a block with `<!-- not run: why -->` (quoted here, so no marker).
        ```bash
        python -m daskvine_py demo
        ```

        <!-- not run: needs a cluster -->

        ```python
        import dask
        ```

        - a list item:

          ```python
          print("indented")
          ```
        ```python
        ```
        ```yaml
        <!-- not run: inside a yaml block, and no python block below -->
        ```
        """
    )
    blocks, problems = python_blocks(text, "page.md")
    assert blocks == [
        Block("page.md", 9, "import dask\n", "needs a cluster"),
        Block("page.md", 15, 'print("indented")\n', None),
        Block("page.md", 18, "\n", None),
    ]
    assert problems == ["page.md:21: a 'not run' marker not above a python block"]


@pytest.mark.parametrize(
    ("marker", "problem"),
    [
        ("<!-- not run: -->", "page.md:1: a 'not run' marker gives no reason"),
        ("<!-- not run -->", "page.md:1: not a marker: '<!-- not run -->'"),
        ("<!-- Not-run: slurm -->", "page.md:1: not a marker: '<!-- Not-run: slurm -->'"),
    ],
)
def test_a_marker_without_a_reason_is_a_problem(marker, problem):
    blocks, problems = python_blocks(f"{marker}\n```python\nx = 1\n```\n", "page.md")
    assert problems == [problem]
    assert blocks[0].not_run in ("", None)
