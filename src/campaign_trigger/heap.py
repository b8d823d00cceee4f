"""The garbage collector of a long-running process: what it loaded at its start frozen.

A server process loads at its start most of what it holds for life: modules, models,
routes, settings (a worker ~230,000 objects, the API ~260,000, the Prefect server
~580,000). CPython's collector looks at every object it tracks in each full pass, and
with its default thresholds (a young pass every 700 allocations) a busy process makes a
full pass every few tens of seconds: in the Prefect server a pass of 0.4 s, during which
its event loop answers nothing, and ~4 % of its CPU in all under load; ~30 % of the
worker's CPU per message before :func:`settle` (docs/benchmarks.md).

:func:`settle` freezes what the process holds so far (no pass looks at it again) and
lets the collector make a young pass every :data:`YOUNG_PASS_EVERY` allocations: most of
what a request or a message allocates is freed before a pass would look at it, and what
survives (a cycle) is still collected. Only for a process that serves until it exits:
objects frozen and dropped later are never collected. :func:`starting`, first thing in
such a process, spares its start the same passes.
"""

from __future__ import annotations

import gc

YOUNG_PASS_EVERY = 50_000  # allocations between young passes (CPython's default: 700)


def starting() -> None:
    """Make the collector's passes rare while a server process loads what it holds for
    life (every ``campaign-trigger`` command, the embedded Prefect server): each full pass
    walks everything loaded so far, all of it alive; a start (its imports, its
    application) takes ~10 % less CPU (~0.5 s of ~5.5 s in a worker, the API, the Prefect
    server, on a 2-core machine)."""
    gc.set_threshold(YOUNG_PASS_EVERY, 20, 20)


def settle() -> None:
    """Freeze the heap as it is now and make the collector's passes rarer."""
    gc.collect()
    gc.freeze()
    starting()
