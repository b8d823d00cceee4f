"""The previews' scratch folders: private, removed on exit, and swept after a crash."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from campaign_trigger.config import Settings
from campaign_trigger.services.preview import PREVIEWS_DIR, scratch_storage
from campaign_trigger.store.files import ABANDONED_AFTER


def test_a_scratch_folder_is_private_and_gone_after_the_preview_even_when_it_fails(
    tmp_path: Path,
) -> None:
    settings = Settings(home=tmp_path, secret_key="k" * 40)
    seen: list[Path] = []

    def refused_preview() -> None:
        with scratch_storage(settings) as scratch:
            seen.append(Path(scratch.root))
            with scratch.open("messages/x.arrow", "wb") as handle:
                handle.write(b"data")
            assert seen[0].stat().st_mode & 0o077 == 0
            raise RuntimeError("the checks refused the call")

    with pytest.raises(RuntimeError):
        refused_preview()
    assert seen[0].parent == (tmp_path / PREVIEWS_DIR).resolve()
    assert list((tmp_path / PREVIEWS_DIR).iterdir()) == []


def test_a_folder_abandoned_by_a_crash_is_deleted_by_a_later_preview(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, secret_key="k" * 40)
    parent = tmp_path / PREVIEWS_DIR
    abandoned, running = parent / "preview-crashed", parent / "preview-running"
    for folder in (abandoned, running):
        (folder / "uploads").mkdir(parents=True)
        (folder / "uploads" / "x.csv").write_text("User\nu1\n")
    old = time.time() - ABANDONED_AFTER.total_seconds() - 60
    os.utime(abandoned, (old, old))
    with scratch_storage(settings):
        assert not abandoned.exists()
        assert running.exists()  # another preview, still going
