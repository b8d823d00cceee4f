"""Rendering benchmark: our ``{{ var }}`` rendering against a bare ``str.format`` loop.

Renders N messages of a two-variable title and body three ways and prints the time
of each and the ratio to ``str.format`` (lower is better; target <= 1.0):

* ``str.format``: ``fmt.format(**vars)`` per message (the reference);
* ``compiled``: ``CompiledTemplate.render(vars)`` per message;
* ``vectorised``: ``render_column`` over a pyarrow table (what delivery uses).

Usage: ``.venv/bin/python bench/render.py [N]`` (default 200,000).
"""

from __future__ import annotations

import sys
import time

import pyarrow as pa

from campaign_trigger.services.render import compile_template, render_column
from harness import result

TITLE = "Hello {{ first_name }}!"
BODY = "Your order {{ order_id }} ships today, {{ first_name }}."
TITLE_FMT = "Hello {first_name}!"
BODY_FMT = "Your order {order_id} ships today, {first_name}."


def best_of(runs: int, action: object) -> float:
    assert callable(action)
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    rows = [{"first_name": f"User{i}", "order_id": f"A-{i:08d}"} for i in range(n)]
    table = pa.table(
        {"first_name": [r["first_name"] for r in rows], "order_id": [r["order_id"] for r in rows]}
    )
    title, body = compile_template(TITLE), compile_template(BODY)

    def reference() -> None:
        for r in rows:
            TITLE_FMT.format(**r)
            BODY_FMT.format(**r)

    def compiled() -> None:
        for r in rows:
            title.render(r)
            body.render(r)

    def vectorised() -> None:
        render_column(TITLE, table)
        render_column(BODY, table)

    assert [title.render(r) for r in rows[:3]] == [TITLE_FMT.format(**r) for r in rows[:3]]
    assert render_column(BODY, table.slice(0, 3)) == [BODY_FMT.format(**r) for r in rows[:3]]
    ref = best_of(5, reference)
    print(f"messages: {n:,} (title + body each)")
    print(f"str.format   {ref:8.3f} s  {2 * n / ref:12,.0f} renders/s  ratio 1.00")
    took: dict[str, float] = {}
    for name, action in (("compiled", compiled), ("vectorised", vectorised)):
        took[name] = best_of(5, action)
        print(
            f"{name:<12} {took[name]:8.3f} s  {2 * n / took[name]:12,.0f} renders/s  "
            f"ratio {took[name] / ref:.2f}"
        )
    result(
        "render",
        "render_column (delivery's path), time",
        figure=f"{took['vectorised']:.3f} s ({2 * n / took['vectorised']:,.0f} renders/s)",
        reference=f"{ref:.3f} s (str.format loop, {2 * n / ref:,.0f} renders/s)",
        ratio=took["vectorised"] / ref,
        target="<= 1.0x str.format's time",
        met=took["vectorised"] <= ref,
    )


if __name__ == "__main__":
    main()
