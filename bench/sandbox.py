"""Sandbox speed: FCM and APNs requests/s from one sandbox process, vs a bare nginx.

Starts ``campaign-trigger sandbox`` (one process, a temporary CT_HOME) and a bare nginx
from Debian (configured here, in a temporary folder: one worker process, answering
FCM's success body over HTTP/1.1 and an empty APNs 200 with an ``apns-id`` over h2c and
over TLS with ALPN h2, with the sandbox's own certificate). The load comes from h2load
(nghttp2, C), one thread:

* FCM: ``POST /v1/projects/bench/messages:send`` over HTTP/1.1 keep-alive, 64
  connections, a real access token from the sandbox's token route (the sandbox checks
  it, the payload schema and the token rules, and records every delivery);
* APNs: ``POST /3/device/{token}`` over h2c, 8 connections x 100 streams, a real ES256
  provider JWT (verified once, then cached as Apple would);
* APNs over TLS (ALPN h2), same.

Rounds alternate sandbox and nginx; it prints each run, the medians and the ratio to
nginx, checks that the sandbox recorded exactly the 2xx it answered, and the verdict
against the targets (issue 13: FCM >= 20,000/s, APNs >= 10,000/s).

Needs ``apt-get install nginx-light nghttp2-client``.
Usage: ``.venv/bin/python bench/sandbox.py [-n 200000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

import httpx
import jwt

from harness import free_port, result

TARGETS = {"fcm": 20_000.0, "apns": 10_000.0, "apns-tls": 10_000.0}
FCM_BODY = (
    b'{"message":{"token":"bench-device","notification":{"title":"Hi","body":"Your order'
    b' shipped"},"data":{"request_id":"r","campaign_id":"c"},"android":{"priority":"high",'
    b'"collapse_key":"r:d","notification":{"tag":"r:d"}}}}'
)
APNS_BODY = b'{"aps":{"alert":{"title":"Hi","body":"Your order shipped"},"sound":"default"}}'
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
    listen 127.0.0.1:{http1};
    location / {{ default_type application/json;
      return 200 '{{"name":"projects/bench/messages/0:1700000000000000%31bd1c9631bd1c96"}}'; }}
  }}
  server {{
    listen 127.0.0.1:{h2c} http2;
    location / {{ add_header apns-id 8F8B4A4C-2C2B-4D0B-9E4D-2A3F0C9B7E11; return 200; }}
  }}
  server {{
    listen 127.0.0.1:{tls} ssl http2;
    ssl_certificate {cert}; ssl_certificate_key {key};
    location / {{ add_header apns-id 8F8B4A4C-2C2B-4D0B-9E4D-2A3F0C9B7E11; return 200; }}
  }}
}}
"""
FINISHED = re.compile(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s")
STATUS = re.compile(r"status codes: (\d+) 2xx")


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with closing(socket.socket()) as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


def h2load(args: list[str]) -> tuple[float, int]:
    """(req/s, 2xx answers) of one h2load run."""
    out = subprocess.run(
        ["h2load", "-t", "1", *args], capture_output=True, text=True, check=False
    ).stdout
    finished, status = FINISHED.search(out), STATUS.search(out)
    if not finished or not status:
        raise RuntimeError(f"h2load said:\n{out}")
    return float(finished.group(3)), int(status.group(1))


def credentials(base: str, home: Path) -> tuple[str, str]:
    """A sandbox access token and an APNs provider JWT, made with the service's keys."""
    os.environ["CT_HOME"] = str(home)
    from campaign_trigger.config import Settings
    from campaign_trigger.delivery.auth import FCM_SCOPE, JWT_BEARER
    from campaign_trigger.delivery.credentials import apns_credentials, fcm_credentials

    settings = Settings(home=home)
    fcm, apns = fcm_credentials(settings), apns_credentials(settings)
    now = int(time.time())
    claims = {"iss": fcm.client_email, "scope": FCM_SCOPE, "aud": f"{base}/token"}
    assertion = jwt.encode(
        {**claims, "iat": now, "exp": now + 3600},
        fcm.private_key,
        algorithm="RS256",
        headers={"kid": fcm.private_key_id},
    )
    answer = httpx.post(f"{base}/token", data={"grant_type": JWT_BEARER, "assertion": assertion})
    answer.raise_for_status()
    provider_jwt = jwt.encode(
        {"iss": apns.team_id, "iat": now},
        apns.private_key,
        algorithm="ES256",
        headers={"kid": apns.key_id},
    )
    return str(answer.json()["access_token"]), provider_jwt


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the children on a kill too
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=200_000, help="requests per run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for tool in ("nginx", "h2load"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            sys.exit(f"{tool} is missing: apt-get install nginx-light nghttp2-client")

    work = Path(tempfile.mkdtemp(prefix="ct-bench-sandbox-"))
    home = work / "home"
    ports = {name: free_port() for name in ("sandbox", "sandbox_tls", "http1", "h2c", "tls")}
    env = {
        **os.environ,
        "CT_HOME": str(home),
        "CT_SANDBOX_PORT": str(ports["sandbox"]),
        "CT_SANDBOX_TLS_PORT": str(ports["sandbox_tls"]),
    }
    sandbox = subprocess.Popen(
        [sys.executable, "-m", "campaign_trigger.cli", "sandbox"],
        env=env,
        stdout=(work / "sandbox.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    nginx: subprocess.Popen[bytes] | None = None
    try:
        wait_port(ports["sandbox"])
        wait_port(ports["sandbox_tls"])
        (work / "nginx").mkdir()
        conf = NGINX_CONF.format(
            dir=work / "nginx",
            cert=home / "sandbox-tls.pem",
            key=home / "sandbox-tls-key.pem",
            **ports,
        )
        (work / "nginx" / "nginx.conf").write_text(conf)
        nginx = subprocess.Popen(
            ["nginx", "-c", str(work / "nginx" / "nginx.conf"), "-p", str(work / "nginx")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        for port in ("http1", "h2c", "tls"):
            wait_port(ports[port])
        sandbox_base = f"http://127.0.0.1:{ports['sandbox']}"
        access_token, provider_jwt = credentials(sandbox_base, home)
        run(args.n, args.rounds, ports, work, access_token, provider_jwt, sandbox_base)
    finally:
        for process in (nginx, sandbox):
            if process is not None:
                process.terminate()
                process.wait(20)
        shutil.rmtree(work, ignore_errors=True)


def run(
    n: int,
    rounds: int,
    ports: dict[str, int],
    work: Path,
    access_token: str,
    provider_jwt: str,
    sandbox_base: str,
) -> None:
    (work / "fcm.json").write_bytes(FCM_BODY)
    (work / "apns.json").write_bytes(APNS_BODY)
    fcm_headers = [
        "-H",
        f"authorization: Bearer {access_token}",
        "-H",
        "content-type: application/json",
    ]
    apns_headers = [
        "-H",
        f"authorization: bearer {provider_jwt}",
        "-H",
        "apns-topic: com.example.app",
        "-H",
        "apns-push-type: alert",
        "-H",
        "apns-priority: 10",
        "-H",
        "apns-collapse-id: r:d",
    ]
    devices = [f"/3/device/bench-{i}" for i in range(8)]

    def fcm(port: int) -> list[str]:
        url = f"http://127.0.0.1:{port}/v1/projects/bench/messages:send"
        return ["--h1", "-n", str(n), "-c", "64", "-d", str(work / "fcm.json"), *fcm_headers, url]

    def apns(scheme: str, port: int) -> list[str]:
        urls = [f"{scheme}://127.0.0.1:{port}{device}" for device in devices]
        return [
            "-n",
            str(n),
            "-c",
            "8",
            "-m",
            "100",
            "-d",
            str(work / "apns.json"),
            *apns_headers,
            *urls,
        ]

    contenders = {
        "fcm": (fcm(ports["sandbox"]), fcm(ports["http1"])),
        "apns": (apns("http", ports["sandbox"]), apns("http", ports["h2c"])),
        "apns-tls": (apns("https", ports["sandbox_tls"]), apns("https", ports["tls"])),
    }
    figures: dict[str, dict[str, list[float]]] = {
        k: {"sandbox": [], "nginx": []} for k in contenders
    }
    for round_number in range(1, rounds + 1):
        for kind, (on_sandbox, on_nginx) in contenders.items():
            before = httpx.get(f"{sandbox_base}/sandbox/stats").json()["deliveries"]
            rate, ok = h2load(on_sandbox)
            recorded = httpx.get(f"{sandbox_base}/sandbox/stats").json()["deliveries"] - before
            assert recorded == ok == n, f"{kind}: {ok} answered 2xx, {recorded} recorded of {n}"
            reference, reference_ok = h2load(on_nginx)
            assert reference_ok == n, f"nginx answered {reference_ok} 2xx of {n}"
            figures[kind]["sandbox"].append(rate)
            figures[kind]["nginx"].append(reference)
            print(
                f"round {round_number} {kind:<9} sandbox {rate:>9,.0f}/s   "
                f"nginx {reference:>9,.0f}/s   ratio {rate / reference:.2f}"
            )
        httpx.delete(f"{sandbox_base}/sandbox/deliveries")
    print(f"\n{n:,} requests per run, {rounds} rounds, medians:")
    for kind, runs in figures.items():
        mine, reference = statistics.median(runs["sandbox"]), statistics.median(runs["nginx"])
        result(
            "sandbox",
            f"{kind}, one sandbox process under h2load",
            figure=f"{mine:,.0f} req/s",
            reference=f"{reference:,.0f} req/s (bare nginx, same load)",
            ratio=mine / reference,
            target=f">= {TARGETS[kind]:,.0f} req/s",
            met=mine >= TARGETS[kind],
        )
    print(
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, "
        "other engineers' runs included: the machine may be shared)"
    )


if __name__ == "__main__":
    main()
