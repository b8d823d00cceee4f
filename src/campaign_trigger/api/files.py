"""Signed downloads: report files and CSV message files, by expiring HMAC-signed links."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import StreamingResponse

from campaign_trigger.api.deps import SettingsDep, StorageDep
from campaign_trigger.api.responses import errors
from campaign_trigger.errors import Forbidden
from campaign_trigger.services.signing import verify
from campaign_trigger.store.files import Storage

router = APIRouter(prefix="/files", tags=["files"])

BAD_LINK = "This link is invalid or has expired"
PIECE = 1 << 20
_HEX_SIGNATURE = re.compile(r"[0-9a-f]{64}")


def _pieces(storage: Storage, key: str) -> Iterator[bytes]:
    with storage.open(key, "rb") as handle:
        while piece := handle.read(PIECE):
            yield piece


@router.get(
    "/{key:path}",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "The CSV file, kept by no cache",
            "content": {"text/csv": {}},
            "headers": {
                "Cache-Control": {"description": "`no-store`", "schema": {"type": "string"}}
            },
        },
        **errors(400, 403, 404),
    },
)
def read_file(
    key: Annotated[str, Path(description="The file's storage key, as in the link.")],
    expires: Annotated[int, Query(description="Expiry, epoch seconds.", ge=0, le=2**62)],
    signature: Annotated[str, Query(description="HMAC-SHA256 of path and expiry.", max_length=128)],
    settings: SettingsDep,
    storage: StorageDep,
) -> StreamingResponse:
    """Download a file by a signed link (valid one hour)."""
    path = f"/files/{key}"
    signed = _HEX_SIGNATURE.fullmatch(signature) is not None and verify(
        settings=settings, path=path, expires=expires, signature=signature
    )
    if not signed:
        raise Forbidden(BAD_LINK)
    try:
        exists = storage.exists(key)
    except ValueError:
        exists = False
    if not exists:
        raise Forbidden(BAD_LINK)
    name = "".join(c for c in key.rsplit("/", 1)[-1] if c.isalnum() or c in "._-") or "file.csv"
    return StreamingResponse(
        _pieces(storage, key),
        media_type="text/csv",
        headers={
            "Content-Disposition": f'attachment; filename="{name}"',
            "Cache-Control": "no-store",
        },
    )
