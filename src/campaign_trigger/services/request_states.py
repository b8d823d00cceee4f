"""A request's state: the mirror of its flow run's state, in one place.

The flow run's state is the request's state (DESIGN §3); ``Request.state`` mirrors it
for queries. :func:`mirror_of` is THE mapping from a Prefect state to a request
state, used by the API's reads, the reconciler and the workers; :func:`set_state`
writes the mirror, optionally only from the state the caller saw (so a correction never
overwrites a newer write), and queues the completion webhooks of a final state.

A cancelled request stays cancelled: no run of it starts again (its claim is refused),
and what its stopped run goes through on its way to Cancelled (Crashed as its task is
cancelled, a crash hook's ``failed``) must not reach the tenant as a second, wrong
completion event. A processed request stays processed: its report is written and
``request.processed`` announced, and a run of it after that (taken over from a worker
that died before Completed, or retried in the UI) sends nothing, redoes the report and
must not announce it again, nor call it running or failed meanwhile. These two are where
the mirror may differ from the run for a while: Prefect's state wins everywhere else.
"""

from __future__ import annotations

from collections.abc import Collection

from prefect.client.schemas.objects import State, StateType
from sqlalchemy import update
from sqlmodel import Session, col

from campaign_trigger.services import prefect_runs, webhooks
from campaign_trigger.store.models import Request, RequestState

SETTLED = (RequestState.canceled, RequestState.processed)  # never left (above)

_MIRROR = {
    StateType.SCHEDULED: RequestState.scheduled,
    StateType.PENDING: RequestState.running,
    StateType.RUNNING: RequestState.running,
    StateType.PAUSED: RequestState.running,
    StateType.CANCELLED: RequestState.canceled,
    StateType.CANCELLING: RequestState.canceled,
    StateType.FAILED: RequestState.failed,
    StateType.CRASHED: RequestState.failed,
}


def mirror_of(state: State | None, *, has_reports: bool) -> RequestState | None:
    """The request state a run state calls for; None when it calls for none.

    A Completed run is a processed request once its reports are written (the flow
    writes them, with the state, just before completing); until then the flow's own
    write decides. A run marked dead (Crashed, ``Worker lost``) is still running: a
    live worker takes it over and finishes it.
    """
    if state is None:
        return None
    if state.type == StateType.COMPLETED:
        return RequestState.processed if has_reports else None
    if state.type == StateType.CRASHED and state.name == prefect_runs.DEAD_RUN_STATE_NAME:
        return RequestState.running
    return _MIRROR.get(state.type)


def set_state(
    *,
    session: Session,
    request_id: str,
    state: RequestState,
    only_from: Collection[RequestState] | None = None,
) -> bool:
    """Mirror ``state`` on the request (only from ``only_from`` when given, never from
    canceled or processed); True if it changed (the caller commits). A request reaching a
    final state queues its completion webhooks in the same transaction."""
    statement = update(Request).where(col(Request.id) == request_id)
    statement = statement.where(col(Request.state).not_in([state, *SETTLED]))
    if only_from is not None:
        statement = statement.where(col(Request.state).in_(list(only_from)))
    result = session.execute(statement.values(state=state))
    changed = bool(getattr(result, "rowcount", 0))
    if changed:
        webhooks.record_final_state(session=session, request_id=request_id, state=state)
    return changed
