"""How the docs test reads a page: which blocks run, what they must print, what is skipped
and why; and that a page's blocks share one shell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from docs_runner import matches, outputs, read_page, script

PAGE = """# A page

```sh
GREETING=hello
echo "$GREETING"
```

```output
hel...
```

<!-- docs-test: skip-block: it starts a server that runs until Ctrl-C -->
```sh
make up
```

```yaml
not: run
```

```python
import os
print(os.environ["GREETING"], 6 * 7)
```

Some prose, then an unrelated block:

```output
never attached to the python block above
```
"""


def test_sh_and_python_blocks_run_with_their_outputs_and_skips(tmp_path: Path) -> None:
    path = tmp_path / "page.md"
    path.write_text(
        PAGE.replace(
            "\n\nSome prose, then an unrelated block:\n\n```output\n"
            "never attached to the python block above\n```\n",
            "\n",
        )
    )
    page = read_page(path)
    assert [b.kind for b in page.blocks] == ["sh", "python"]
    assert page.blocks[0].expected == "hel...\n"
    assert page.blocks[1].expected is None
    assert page.skipped == [(13, "it starts a server that runs until Ctrl-C")]
    assert page.skip_reason is None


def test_an_output_block_after_prose_is_a_mistake_of_the_page(tmp_path: Path) -> None:
    path = tmp_path / "page.md"
    path.write_text(PAGE)
    with pytest.raises(ValueError, match="follows no command block"):
        read_page(path)


def test_a_page_says_why_it_cannot_run(tmp_path: Path) -> None:
    path = tmp_path / "page.md"
    path.write_text("<!-- docs-test: skip-page: needs fixed ports -->\n# Page\n")
    assert read_page(path).skip_reason == "needs fixed ports"


def test_the_blocks_share_one_shell_and_each_output_is_cut_apart(tmp_path: Path) -> None:
    path = tmp_path / "page.md"
    path.write_text(PAGE.split("\n\nSome prose")[0] + "\n")
    page = read_page(path)
    os_env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["bash", "-c", "export GREETING\n" + script(page.blocks, python=sys.executable)],
        env=os_env,
        capture_output=True,
        text=True,
        check=True,
    )
    printed, unfinished = outputs(done.stdout)
    assert printed == {0: "hello", 1: "hello 42"}
    assert unfinished is None
    assert matches(page.blocks[0].expected or "", printed[0])


def test_a_failing_block_is_named() -> None:
    printed, unfinished = outputs(
        "@@docs-test-block 0 start\nok\n@@docs-test-block 0 end\n"
        "@@docs-test-block 1 start\npartial\n"
    )
    assert printed == {0: "ok"}
    assert unfinished == 1


def test_output_without_a_final_newline_is_still_its_blocks() -> None:
    printed, unfinished = outputs(
        '@@docs-test-block 0 start\n{"request_id":"r1"}@@docs-test-block 0 end\n'
    )
    assert printed == {0: '{"request_id":"r1"}'}
    assert unfinished is None


def test_dots_stand_for_any_text_and_nothing_else_is_loose() -> None:
    assert matches('{"request_id":"..."}', '{"request_id":"3f0c9a"}\n')
    assert matches("a\n...\nz", "a\nb\nc\nz")
    assert not matches('{"request_id":"..."}', '{"error_message":"x"}')
    assert not matches("1", "12")
