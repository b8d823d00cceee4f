"""A 100 k-recipient request through the whole stack: the sandbox vs a bare nginx.

The same stack twice per round, only the FCM provider differs: a Prefect server (SQLite,
``harness.private_stack``; ``run_all.py``'s shared one in quick mode), the API
(``campaign-trigger api``), a delivery worker (``campaign-trigger worker``) and either
``campaign-trigger sandbox`` (one process: checks the OAuth assertion and every bearer,
validates each message, applies the token rules, records each delivery) or a bare nginx
from Debian (one worker: a fixed access token and FCM's success body, no checks). One
Android device per user; the measure is upload → report: from the CSV upload (``POST
/api/campaigns/trigger``) to the report's links answering, and every report row is checked
to be a success.

Target (issue 13): the sandbox's time within 1.25x of nginx's.
Needs ``apt-get install nginx-light``.
Usage: ``.venv/bin/python bench/sandbox_end_to_end.py [--users 100000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psutil

from harness import free_port, private_stack, report_links, result, tree_cpu

TARGET_RATIO = 1.25
TARGET_USERS = 100_000

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  keepalive_requests 10000000;
  server {{
    listen 127.0.0.1:{port};
    default_type application/json;
    location = /token {{
      return 200 '{{"access_token":"ya29.nginx","expires_in":3599,"token_type":"Bearer"}}';
    }}
    location / {{
      return 200 '{{"name":"projects/sandbox-project/messages/0:1700000000000000%31bd1c96"}}';
    }}
  }}
}}
"""
PASSWORD = "bench-password-1"


def wait_http(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


class Children:
    """Child processes, each in its own session, logging to the work folder."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work, self.env, self.running = work, env, {}  # type: ignore[var-annotated]

    def start(self, name: str, argv: list[str], **env: str) -> None:
        log = (self.work / f"{name}.log").open("ab")
        self.running[name] = subprocess.Popen(
            argv,
            env={**os.environ, **self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self, name: str) -> None:
        process = self.running.pop(name, None)
        if process is not None:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()

    def stop_all(self) -> None:
        for name in list(self.running):
            self.stop(name)


def seed(users: int) -> tuple[str, str]:
    """An organisation, a member account, an Android app with ``users`` devices and a
    started campaign; returns (e-mail, campaign id)."""
    from sqlalchemy import insert

    from campaign_trigger.services import admin
    from campaign_trigger.store.db import session_scope
    from campaign_trigger.store.models import Device

    org, email = f"bench-{uuid.uuid4().hex[:6]}", f"bench-{uuid.uuid4().hex[:6]}@example.com"
    with session_scope() as session:
        admin.create_org(session=session, name=org, quota=10**8)
        admin.create_account(session=session, org_name=org, email=email, password=PASSWORD)
        admin.create_app(session=session, org_name=org, app_id=f"{org}-android", platform="android")
        campaign = admin.create_campaign(
            session=session,
            org_name=org,
            app_ids=[f"{org}-android"],
            channel="push",
            title="Hi {{ name }}",
            body="Order {{ order }} has shipped",
        )
        admin.launch_campaign(session=session, campaign_id=campaign.id)
        campaign_id = campaign.id
    now = datetime.now(UTC)
    for start in range(0, users, 20_000):
        rows = [
            {
                "app_id": f"{org}-android",
                "device_id": f"d{i}",
                "user_id": f"u{i}",
                "push_token": f"e2e-{i}",
                "opted_in": True,
                "logged_in": True,
                "updated_at": now,
            }
            for i in range(start, min(users, start + 20_000))
        ]
        with session_scope() as session:
            session.execute(insert(Device), rows)
    return email, campaign_id


def upload_to_report(api: str, email: str, campaign_id: str, users: int) -> float:
    """Seconds from the CSV upload to the report's links, every row checked."""
    signed = httpx.post(
        f"{api}/users/sign_in", json={"user": {"email": email, "password": PASSWORD}}
    )
    token = signed.headers["Authorization"]
    lines = io.StringIO()
    writer = csv.writer(lines)
    writer.writerow(["User", "name", "order"])
    writer.writerows([f"u{i}", f"N{i}", f"O-{i}"] for i in range(users))
    started = time.monotonic()
    created = httpx.post(
        f"{api}/api/campaigns/trigger",
        headers={"Authorization": token},
        data={"campaign_id": campaign_id},
        files={"file": ("batch.csv", lines.getvalue().encode(), "text/csv")},
        timeout=300,
    )
    created.raise_for_status()
    request_id = created.json()["request_id"]
    reports = report_links(api, {"Authorization": token}, request_id, timeout=600)
    elapsed = time.monotonic() - started
    rows = []
    for link in reports:
        rows += list(csv.DictReader(io.StringIO(httpx.get(link, timeout=60).text)))
    failed = [row for row in rows if row["error_message"]]
    assert len(rows) == users, f"{len(rows)} report rows for {users} users"
    assert not failed, f"{len(failed)} failed, e.g. {failed[0]}"
    return elapsed


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the children on a kill too
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        sys.exit("nginx is missing: apt-get install nginx-light")
    ports = {k: free_port() for k in ("api", "sandbox", "sandbox_tls", "nginx")}
    env = {
        "CT_API_PORT": str(ports["api"]),
        "CT_SANDBOX_PORT": str(ports["sandbox"]),
        "CT_SANDBOX_TLS_PORT": str(ports["sandbox_tls"]),
        "CT_API_RECONCILER": "true",
    }
    with private_stack() as home:
        os.environ.update(env)
        from campaign_trigger.config import get_settings

        get_settings.cache_clear()
        work = home / f"e2e-{ports['api']}"
        work.mkdir()
        run(args, work, ports, Children(work, env))


def run(args: argparse.Namespace, work: Path, ports: dict[str, int], children: Children) -> None:
    exe = [sys.executable, "-m", "campaign_trigger.cli"]
    try:
        children.start("api", [*exe, "api"])
        api = f"http://127.0.0.1:{ports['api']}"
        wait_http(f"{api}/health")
        (work / "nginx").mkdir()
        (work / "nginx" / "nginx.conf").write_text(
            NGINX_CONF.format(dir=work / "nginx", port=ports["nginx"])
        )
        children.start(
            "nginx", ["nginx", "-c", str(work / "nginx" / "nginx.conf"), "-p", str(work / "nginx")]
        )
        children.start("sandbox", [*exe, "sandbox"])
        sandbox = f"http://127.0.0.1:{ports['sandbox']}"
        wait_http(f"{sandbox}/sandbox/stats")
        nginx = f"http://127.0.0.1:{ports['nginx']}"
        print("stack up; seeding …", file=sys.stderr, flush=True)
        email, campaign_id = seed(args.users)
        print("seeded", file=sys.stderr, flush=True)
        providers = {"sandbox": sandbox, "nginx": nginx}
        times: dict[str, list[float]] = {name: [] for name in providers}
        for round_number in range(1, args.rounds + 1):
            order = list(providers.items())
            for name, base in (
                order if round_number % 2 else order[::-1]
            ):  # alternate who goes first
                children.start(
                    "worker",
                    [*exe, "worker", "--concurrency", "4"],
                    CT_FCM_BASE_URL=base,
                    CT_FCM_TOKEN_URI=f"{base}/token",
                )
                while b"ready: polling" not in (work / "worker.log").read_bytes():
                    if children.running["worker"].poll() is not None:
                        sys.exit((work / "worker.log").read_text()[-2000:])
                    time.sleep(0.1)
                print(f"worker ready ({name})", file=sys.stderr, flush=True)
                httpx.delete(f"{sandbox}/sandbox/deliveries")
                provider = psutil.Process(children.running[name].pid)
                cpu = tree_cpu(provider)
                elapsed = upload_to_report(api, email, campaign_id, args.users)
                cpu = tree_cpu(provider) - cpu
                if name == "sandbox":
                    delivered = httpx.get(f"{sandbox}/sandbox/stats").json()["deliveries"]
                    assert delivered == args.users, f"the sandbox recorded {delivered}"
                times[name].append(elapsed)
                print(
                    f"round {round_number} {name:<8} upload → report {elapsed:6.1f} s   "
                    f"provider CPU {cpu:5.1f} s ({cpu / args.users * 1e6:4.0f} µs/message)"
                )
                children.stop("worker")
                (work / "worker.log").unlink()
        mine, reference = statistics.median(times["sandbox"]), statistics.median(times["nginx"])
        print(
            f"\n{args.users:,} recipients, {args.rounds} rounds; load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (the machine may be shared)"
        )
        decided = args.users >= TARGET_USERS
        result(
            "sandbox_end_to_end",
            f"{args.users:,} recipients upload -> report with the sandbox, median of {args.rounds}",
            figure=f"{mine:.1f} s",
            reference=f"{reference:.1f} s (bare nginx answering FCM, same stack)",
            ratio=mine / reference,
            target=f"<= {TARGET_RATIO}x nginx's time at {TARGET_USERS:,} recipients",
            met=mine <= TARGET_RATIO * reference if decided else None,
            why="" if decided else f"quick size: judged at {TARGET_USERS:,} recipients",
        )
    finally:
        children.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
