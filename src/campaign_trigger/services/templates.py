"""Campaign templates: ``{{ name }}`` placeholders in a title or body.

Only plain variable placeholders are allowed (Jinja2's ``{{ var }}`` syntax, with
no attribute access, filters or code), so rendering is a safe, fast substitution.
"""

from __future__ import annotations

import re

from campaign_trigger.errors import InvalidInput

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_ANY_TAG = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.DOTALL)


def template_variables(*templates: str) -> list[str]:
    """The variable names of the templates, in order of first appearance.

    Raises InvalidInput for template syntax beyond plain ``{{ name }}`` placeholders.
    """
    names: list[str] = []
    for template in templates:
        for tag in _ANY_TAG.finditer(template):
            match = PLACEHOLDER.fullmatch(tag.group(0))
            if match is None:
                raise InvalidInput(
                    f"Unsupported template syntax {tag.group(0)!r}: only {{{{ name }}}} "
                    "placeholders are allowed"
                )
            if match.group(1) not in names:
                names.append(match.group(1))
    return names
