"""Sign-in and sign-out: ``POST /users/sign_in`` (and ``.json``), ``DELETE /users/sign_out``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.status import HTTP_204_NO_CONTENT

from campaign_trigger.api.deps import CurrentAccount, SessionDep, SettingsDep
from campaign_trigger.api.responses import errors
from campaign_trigger.schemas.api import ErrorBody, SignedIn, SignInBody
from campaign_trigger.services.auth import (
    issue_token,
    organisation_name,
    revoke_token,
    sign_in,
)

router = APIRouter(prefix="/users", tags=["authentication"])

_SIGN_IN_RESPONSES = {
    200: {
        "description": "Signed in; the token is in the `Authorization` header.",
        "headers": {
            "Authorization": {
                "description": "`Bearer <ACCESS_TOKEN>`, to send unchanged on later calls.",
                "schema": {"type": "string"},
            },
            "Cache-Control": {
                "description": "`no-store`: the token is kept by no cache.",
                "schema": {"type": "string"},
            },
        },
    },
    **errors(400, 401, 413),
    429: {
        "model": ErrorBody,
        "description": "Too many failed sign-ins for this account (5 in 15 minutes by "
        "default) or from this address (50); `Retry-After` says when to try again. No "
        "password is checked meanwhile; a successful sign-in resets the account's count.",
        "headers": {
            "Retry-After": {
                "description": "Seconds until the next attempt may be made.",
                "schema": {"type": "integer"},
            }
        },
    },
}


@router.post("/sign_in", responses=_SIGN_IN_RESPONSES)
@router.post(
    "/sign_in.json",
    responses=_SIGN_IN_RESPONSES,
    include_in_schema=True,
    operation_id="create_session_json",
)
def create_session(
    body: SignInBody,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
) -> SignedIn:
    """Sign in with e-mail and password; the access token comes back in `Authorization`.

    Failed sign-ins are throttled per account and per client address (429)."""
    address = request.client.host if request.client is not None else "unknown"
    account = sign_in(
        session=session,
        settings=settings,
        email=body.user.email,
        password=body.user.password,
        address=address,
    )
    response.headers["Authorization"] = f"Bearer {issue_token(settings=settings, account=account)}"
    response.headers["Cache-Control"] = "no-store"
    return SignedIn(
        email=account.email,
        role=account.role.value,
        organisation=organisation_name(session=session, org_id=account.org_id),
    )


@router.delete("/sign_out", status_code=HTTP_204_NO_CONTENT, responses=errors(401))
def delete_session(identity: CurrentAccount, session: SessionDep) -> Response:
    """Sign out: the token used for this call is refused from now on."""
    revoke_token(session=session, identity=identity)
    return Response(status_code=HTTP_204_NO_CONTENT)
