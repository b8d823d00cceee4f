"""``campaign-trigger admin`` run in-process, as the admin CLI tests call it."""

from __future__ import annotations

from typer.testing import CliRunner

from campaign_trigger.cli import app

runner = CliRunner()


def admin(*args: str) -> tuple[int, str]:
    """Exit code and output of ``campaign-trigger admin *args``."""
    result = runner.invoke(app, ["admin", *args])
    return result.exit_code, result.output


def ok(*args: str) -> str:
    """The output of a command that must succeed."""
    code, output = admin(*args)
    assert code == 0, output
    return output


def refused(*args: str) -> str:
    """The one ``error:`` line of a command that must be refused (exit 1)."""
    code, output = admin(*args)
    assert code == 1, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: "), output
    return lines[0]
