"""The pandera model of an uploaded message file, built for a campaign's variables.

Blocks of the file arrive as pandas frames backed by Arrow strings (zero copy), so
the checks run on Arrow kernels: ``User`` present, never null, never empty or blank,
at most 200 characters; every campaign variable present as a column. Extra columns
are allowed.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any

import pandas as pd
import pandera.pandas as pa
import pyarrow
from pandera.typing import Series

ArrowString = Annotated[pd.ArrowDtype, pyarrow.string()]

USER_COLUMN = "User"
MAX_USER_ID = 200  # as for JSON messages and device registrations


class MessageFile(pa.DataFrameModel):
    """A message file with only the `User` column required."""

    User: Series[ArrowString] = pa.Field(
        nullable=False, str_length={"min_value": 1, "max_value": MAX_USER_ID}
    )

    @pa.check(USER_COLUMN, name="not_blank")
    @classmethod
    def user_not_blank(cls, users: Series[Any]) -> Series[bool]:
        """A user id of spaces only is as empty as an empty one."""
        return ~users.str.isspace()  # type: ignore[no-any-return]

    class Config:
        strict = False
        coerce = False


@lru_cache(maxsize=256)
def message_file_model(variables: tuple[str, ...]) -> type[MessageFile]:
    """A ``MessageFile`` that also requires one column per campaign variable."""
    if not variables:
        return MessageFile
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__annotations__": annotations}
    for position, name in enumerate(variables):
        if name == USER_COLUMN:
            continue
        # Attribute names of our own (a variable may be called `validate`); the alias
        # is the column name.
        annotations[f"variable_{position}"] = Series[ArrowString]
        namespace[f"variable_{position}"] = pa.Field(nullable=True, alias=name)
    return type("CampaignMessageFile", (MessageFile,), namespace)
