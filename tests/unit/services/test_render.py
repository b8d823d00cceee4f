"""Template rendering: plain placeholders only, nulls as '', one by one or vectorised alike."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from campaign_trigger.errors import InvalidInput
from campaign_trigger.services.render import compile_template, render_column


def test_placeholders_are_replaced_and_literals_kept() -> None:
    template = compile_template("Hi {{ name }}, {{n}} {x} {{ name }}!")
    assert template.render({"name": "Ann", "n": 3}) == "Hi Ann, 3 {x} Ann!"


def test_missing_and_null_values_render_empty() -> None:
    assert compile_template("[{{ a }}|{{ b }}]").render({"a": None}) == "[|]"


@pytest.mark.parametrize(
    "template",
    [
        "{{ user.__class__ }}",
        "{{ a|upper }}",
        "{% for x in y %}{% endfor %}",
        "{{ 1 + 1 }}",
        "{# c #}",
    ],
)
def test_anything_but_a_plain_placeholder_is_refused(template: str) -> None:
    with pytest.raises(InvalidInput):
        compile_template(template)


def test_values_are_never_evaluated() -> None:
    assert compile_template("{{ a }}").render({"a": "{{ b }}"}) == "{{ b }}"


def test_a_column_renders_like_one_by_one() -> None:
    table = pa.table({"a": ["x", None, "=1"], "b": ["1", "2", "3"]})
    rows: list[dict[str, str | None]] = [
        {"a": "x", "b": "1"},
        {"a": None, "b": "2"},
        {"a": "=1", "b": "3"},
    ]
    template = "<{{a}}-{{ b }}-{{ missing }}>"
    assert render_column(template, table) == [compile_template(template).render(r) for r in rows]


def test_a_template_without_placeholders_is_repeated() -> None:
    assert render_column("static", pa.table({"a": ["1", "2"]})) == ["static", "static"]


@given(st.lists(st.text(), min_size=1, max_size=20), st.text(alphabet="ab} ,.", max_size=12))
def test_vectorised_and_scalar_rendering_agree(values: list[str], literal: str) -> None:
    template = f"{literal}{{{{ v }}}}{literal}"
    table = pa.table({"v": pa.array(values, pa.string())})
    expected = [compile_template(template).render({"v": v}) for v in values]
    assert render_column(template, table) == expected
