"""Read a documentation page as a newcomer would run it: its shell and Python blocks, in order.

A page is Markdown. Its fenced blocks tagged ``sh`` (or ``bash``) and ``python`` are
commands to run; a block tagged ``output`` right after one is what that block prints
(``...`` stands for any text). Blocks with other tags (``yaml``, ``json``, none) are
illustrations. HTML comments, invisible on the rendered page, tell the runner what a
reader would do differently, and why:

* ``<!-- docs-test: skip-page: REASON -->``: the page cannot be run this way (REASON);
* ``<!-- docs-test: skip-block: REASON -->`` just before a block: that block is not run
  (a long-running server the runner starts itself, an elided key);

A page's blocks become one bash script, run in one shell as a reader's terminal would
(variables set by one block are there for the next); a Python block runs with
``.venv/bin/python`` in that shell. Each block's output is cut out of the script's
output by markers, so an ``output`` block is compared with its own block's output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^```(\S*)\s*$")
SKIP_PAGE = re.compile(r"<!--\s*docs-test:\s*skip-page:\s*(.*?)\s*-->", re.DOTALL)
SKIP_BLOCK = re.compile(r"^<!--\s*docs-test:\s*skip-block:\s*(.*?)\s*-->\s*$")
RUNNABLE = {"sh": "sh", "bash": "sh", "python": "python"}
MARK = "@@docs-test-block"


@dataclass
class Block:
    """One fenced block to run, where it is on the page, and what it must print."""

    kind: str  # "sh" or "python"
    code: str
    line: int
    expected: str | None = None


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line, reason)
    skip_reason: str | None = None


def read_page(path: Path) -> Page:
    """The runnable blocks of ``path``, with their expected outputs and skip reasons."""
    text = path.read_text()
    page = Page(path=path)
    whole = SKIP_PAGE.search(text)
    if whole:
        page.skip_reason = whole.group(1)
    lines = text.splitlines()
    index = 0
    pending_skip: str | None = None
    last_run: Block | None = None
    while index < len(lines):
        line = lines[index]
        skip = SKIP_BLOCK.match(line)
        if skip:
            pending_skip = skip.group(1)
            index += 1
            continue
        fence = FENCE.match(line)
        if not fence:
            if line.strip():
                pending_skip = None
                last_run = None if not line.startswith("<!--") else last_run
            index += 1
            continue
        tag, start = fence.group(1), index + 1
        end = start
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        body = "\n".join(lines[start:end]) + "\n"
        if tag == "output":
            if last_run is None:
                raise ValueError(f"{path.name}:{start}: an output block follows no command block")
            last_run.expected = body
            last_run = None
        elif tag in RUNNABLE and pending_skip is not None:
            page.skipped.append((start, pending_skip))
            last_run = None
        elif tag in RUNNABLE:
            last_run = Block(kind=RUNNABLE[tag], code=body, line=start)
            page.blocks.append(last_run)
        else:
            last_run = None
        pending_skip = None
        index = end + 1
    return page


def script(blocks: list[Block], *, python: str) -> str:
    """One bash script running ``blocks`` in order, each between markers on stdout."""
    parts = ["set -euo pipefail"]
    for number, block in enumerate(blocks):
        parts.append(f"echo '{MARK} {number} start'")
        if block.kind == "python":
            delimiter = f"DOCS_TEST_PYTHON_{number}"
            parts.append(f"{python} - <<'{delimiter}'\n{block.code}{delimiter}")
        else:
            parts.append(block.code)
        parts.append(f"echo '{MARK} {number} end'")
    return "\n".join(parts) + "\n"


def outputs(stdout: str) -> tuple[dict[int, str], int | None]:
    """Each finished block's output, and the block that started but did not end."""
    done: dict[int, str] = {}
    current: int | None = None
    collected: list[str] = []
    for line in stdout.splitlines():
        if MARK in line:  # a block whose output does not end with a newline: cut there
            before, _, marker = line.partition(MARK)
            if before:
                collected.append(before)
            number, what = marker.split()
            if what == "start":
                current, collected = int(number), []
            else:
                done[int(number)] = "\n".join(collected)
                current = None
            continue
        collected.append(line)
    return done, current


def matches(expected: str, actual: str) -> bool:
    """``actual`` is ``expected`` where ``...`` stands for any text (trailing blanks
    ignored)."""
    pattern = ".*?".join(re.escape(part) for part in expected.strip().split("..."))
    return re.fullmatch(pattern, actual.strip(), flags=re.DOTALL) is not None
