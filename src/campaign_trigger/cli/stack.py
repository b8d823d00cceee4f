"""The embedded stack and its parts: ``up``, ``api``, ``sandbox``, ``worker``, ``runner``."""

from __future__ import annotations

from typing import Annotated

import typer

from campaign_trigger.cli.base import app, fail, migrate, say
from campaign_trigger.config import get_settings
from campaign_trigger.errors import CampaignTriggerError


@app.command()
def up(
    no_demo: Annotated[bool, typer.Option("--no-demo", help="Do not seed the demo.")] = False,
) -> None:
    """Run the whole stack on this machine until Ctrl-C."""
    from campaign_trigger import stack

    settings = get_settings()
    try:
        children, shared_env = stack.plan(settings)
    except CampaignTriggerError as exc:
        fail(exc.message)
    say("Migrating the database …")
    migrate()
    tenant = None
    if not no_demo:
        from campaign_trigger.services import demo
        from campaign_trigger.store.db import session_scope

        say("Seeding the demo tenant …")
        with session_scope() as session:
            tenant = demo.seed(session=session, home=settings.home.resolve())

    from campaign_trigger.delivery.sandbox_tls import ca_path

    sandbox_ca = ca_path(settings.home)

    def on_ready() -> None:
        api = f"http://{settings.api_host}:{settings.api_port}"
        lines = [
            "",
            "campaign-trigger is up.",
            f"  API           {api}  (OpenAPI: {api}/docs)",
            f"  Prefect UI    {shared_env['PREFECT_API_URL'].removesuffix('/api')}",
            f"  Sandbox       http://{settings.sandbox_host}:{settings.sandbox_port}"
            f"  and https://{settings.sandbox_host}:{settings.sandbox_tls_port}",
            f"  Sandbox CA    {sandbox_ca}  (trust it for the https:// sandbox)",
        ]
        if tenant is not None:
            lines += [
                "",
                "Demo tenant:",
                f"  e-mail        {tenant.email}",
                f"  password      {tenant.password}",
                f"  campaign id   {tenant.campaign_id}  (variables first_name, order_id)",
            ]
        lines += ["", "Press Ctrl-C to stop."]
        say("\n".join(lines))

    try:
        code = stack.run(
            children,
            shared_env,
            log_dir=settings.home.resolve() / "logs",
            say=say,
            on_ready=on_ready,
        )
    except CampaignTriggerError as exc:
        fail(exc.message)
    raise typer.Exit(code)


@app.command()
def api(
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="API processes sharing the port (default CT_API_WORKERS; the database and "
            "the outbox are shared, so any number is safe).",
        ),
    ] = None,
) -> None:
    """Run the HTTP API alone."""
    import uvicorn

    from campaign_trigger import logs

    settings = get_settings()
    uvicorn.run(
        "campaign_trigger.api.app:serve_app",
        factory=True,
        host=settings.api_host,
        port=settings.api_port,
        workers=workers or settings.api_workers,
        log_level="info",
        log_config=logs.dict_config(settings.log_format),
        access_log=False,
    )


@app.command()
def sandbox(
    latency_ms: Annotated[float, typer.Option(help="Added to every answer.")] = 0.0,
) -> None:
    """Run the sandbox push providers (FCM and APNs stand-ins) alone.

    Cleartext on CT_SANDBOX_PORT (8010) and TLS on CT_SANDBOX_TLS_PORT (8443), both HTTP/1.1
    and HTTP/2; the certificate comes from a CA made once in CT_HOME (sandbox-ca.pem).

    See docs/sandbox.md.
    """
    from campaign_trigger import logs
    from campaign_trigger.delivery.sandbox import serve

    settings = get_settings()
    logs.configure(settings.log_format)
    serve(
        host=settings.sandbox_host,
        port=settings.sandbox_port,
        tls_port=settings.sandbox_tls_port,
        latency_ms=latency_ms,
    )


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option(help="Request runs executed at once.")] = 4,
    chunk_concurrency: Annotated[
        int,
        typer.Option(
            help="Chunks of large requests' shares (deliver-chunks runs) delivered at once; "
            "a share on its last chunk lets the next one start."
        ),
    ] = 2,
    poll_seconds: Annotated[
        float,
        typer.Option(
            help="Seconds between ticks: a queue is polled at once when a run is scheduled "
            "in it (at most once a tick) and as a run scheduled ahead comes due; without "
            "Prefect's event stream every 2nd (requests) or 4th (shares) tick."
        ),
    ] = 0.5,
    prefetch_seconds: Annotated[
        float,
        typer.Option(
            help="Claim runs due within this many seconds (at least two ticks: never late)."
        ),
    ] = 2.0,
    heartbeat_seconds: Annotated[
        int, typer.Option(help="Seconds between the worker's heartbeats to Prefect.")
    ] = 10,
) -> None:
    """Run a delivery worker: a Prefect worker of the pool campaign-trigger-delivery that
    executes deliver-request runs and shares of large requests (deliver-chunks) in-process
    (start N of them, on N machines: every one takes shares of a large request)."""
    from campaign_trigger.deployments.worker import main as worker_main

    worker_main(
        concurrency=concurrency,
        chunk_concurrency=chunk_concurrency,
        poll_seconds=poll_seconds,
        prefetch_seconds=prefetch_seconds,
        heartbeat_seconds=heartbeat_seconds,
    )


@app.command()
def runner(limit: Annotated[int, typer.Option(help="Flow runs executed at once.")] = 4) -> None:
    """Serve the send-batch, daily-csv-batch and maintenance deployments."""
    from campaign_trigger.deployments.runner import main as runner_main

    runner_main(limit=limit)
