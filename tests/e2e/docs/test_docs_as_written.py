"""Every page of the docs, run as written (``tests/docs_runner.py`` says how a page is read).

One ``campaign-trigger up`` stack, started as ``make up`` starts it but on free ports,
from a checkout of its own (a temporary folder holding ``.venv``, whose ``.data`` is the
stack's home): the pages' ``127.0.0.1:8000`` / ``4200`` / ``8010`` / ``8443`` are
replaced by the stack's ports (which the shell's ``CT_*_PORT`` settings also name, so
that links the service signs carry them), nothing else. Each page then runs in one bash shell from
that folder: every block must exit 0, and print what the page shows where it shows it.
The pages run in the order of the README's list, as a newcomer reads them.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from docs_runner import matches, outputs, read_page, script
from support import REPO, VENV_BIN, ManagedProcess, free_port, wait_http

PAGES = [
    "README.md",
    "docs/api-quickstart.md",
    "docs/api-reference.md",
    "docs/prefect-ui.md",
    "docs/scheduling-csv.md",
    "docs/python.md",
    "docs/postgres-and-workers.md",
    "docs/devices-and-inbox.md",
    "docs/apps-and-credentials.md",
    "docs/webhooks.md",
    "docs/security.md",
    "docs/sandbox.md",
    "docs/operations.md",
    "docs/benchmarks.md",
    "docs/architecture.md",
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_page_is_in_the_list_and_links_only_to_what_the_repository_holds() -> None:
    """Relative links resolve to files of the repository (a link to ``../../shared/...``
    works in one engineer's folder layout only)."""
    assert sorted(PAGES) == sorted(
        ["README.md", *(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
    )
    for name in PAGES:
        page = REPO / name
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://")):
                continue  # a web page (the running stack, prefect.io), not a file
            path = target.split("#", 1)[0]
            if path:
                resolved = (page.parent / path).resolve()
                assert resolved.is_relative_to(REPO), f"{name}: {target} leaves the repository"
                assert resolved.exists(), f"{name}: {target} does not exist"


@dataclass
class Newcomer:
    """A checkout with a running stack, and the environment of the reader's shell."""

    folder: Path
    env: dict[str, str]
    ports: dict[str, int]
    stack: ManagedProcess

    def fill(self, code: str) -> str:
        for default, port in (
            ("127.0.0.1:8000", self.ports["api"]),
            ("127.0.0.1:4200", self.ports["prefect"]),
            ("127.0.0.1:8010", self.ports["sandbox"]),
            ("127.0.0.1:8443", self.ports["sandbox_tls"]),
        ):
            code = code.replace(default, f"127.0.0.1:{port}")
        return code


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Newcomer]:
    folder = tmp_path_factory.mktemp("checkout")
    (folder / ".venv").symlink_to(VENV_BIN.parent)
    ports = {name: free_port() for name in ("api", "prefect", "sandbox", "sandbox_tls")}
    # A newcomer's shell: none of the suite's CT_ / PREFECT_ settings. Prefect's own
    # files (profiles of the `prefect` commands) stay in the test's folder.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CT_", "PREFECT_"))}
    env.update(
        PREFECT_HOME=str(folder / ".prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    stack_env = {
        **env,
        "CT_API_PORT": str(ports["api"]),
        "CT_PREFECT_PORT": str(ports["prefect"]),
        "CT_SANDBOX_PORT": str(ports["sandbox"]),
        "CT_SANDBOX_TLS_PORT": str(ports["sandbox_tls"]),
    }
    stack = ManagedProcess(
        "docs-up",
        [str(VENV_BIN / "campaign-trigger"), "up"],
        env=stack_env,
        log_dir=folder,
        cwd=folder,
        inherit_env=False,
    )
    try:
        wait_http(f"http://127.0.0.1:{ports['api']}/health", timeout=240, process=stack)
        wait_http(
            f"http://127.0.0.1:{ports['prefect']}/api/deployments/name/send-batch/daily-csv-batch",
            timeout=120,
            process=stack,
        )
        # The reader's shell knows the stack's ports, as anyone who moved them must.
        yield Newcomer(folder=folder, env=stack_env, ports=ports, stack=stack)
    finally:
        stack.stop()


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("name", PAGES)
def test_the_page_runs_as_written(name: str, newcomer: Newcomer) -> None:
    page = read_page(REPO / name)
    if page.skip_reason is not None:
        pytest.skip(f"{name}: {page.skip_reason}")
    if not page.blocks:
        return  # prose, diagrams and figures only
    for block in page.blocks:
        block.code = newcomer.fill(block.code)
        if block.expected is not None:
            block.expected = newcomer.fill(block.expected)
    done = subprocess.run(
        ["bash", "-c", script(page.blocks, python=".venv/bin/python")],
        env=newcomer.env,
        cwd=newcomer.folder,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    printed, unfinished = outputs(done.stdout)
    if done.returncode != 0:
        failed = page.blocks[unfinished] if unfinished is not None else None
        where = f"the block at line {failed.line}" if failed else "the page"
        raise AssertionError(
            f"{name}: {where} exited {done.returncode}\n{failed.code if failed else ''}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}\n"
            f"--- stack\n{newcomer.stack.log_tail(30)}"
        )
    for number, block in enumerate(page.blocks):
        if block.expected is not None:
            assert matches(block.expected, printed[number]), (
                f"{name}: the block at line {block.line} printed\n{printed[number]}\n"
                f"where the page shows\n{block.expected}"
            )
