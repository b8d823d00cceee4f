"""APNs and FCM details, each as the providers document it (docs/sandbox.md)."""

from __future__ import annotations

import httpx
from sandbox_helpers import APNS_BODY, access_token, apns_headers, fcm

from campaign_trigger.delivery.mapping import BAD_REQUEST_TYPE


def apns(sandbox: str, token: str, body: bytes = APNS_BODY, **headers: str) -> httpx.Response:
    with httpx.Client(http1=False, http2=True) as h2c:
        return h2c.post(
            f"{sandbox}/3/device/{token}", content=body, headers=apns_headers(**headers)
        )


def padded(size: int) -> bytes:
    head = b'{"aps":{"alert":"x"},"pad":"'
    return head + b"p" * (size - len(head) - 2) + b'"}'


def test_collapse_ids_up_to_64_bytes_are_kept_and_longer_ones_refused(sandbox: str) -> None:
    assert apns(sandbox, "ok-c", apns_collapse_id="c" * 64).status_code == 200
    refused = apns(sandbox, "ok-c", apns_collapse_id="c" * 65)
    assert (refused.status_code, refused.json()) == (400, {"reason": "BadCollapseId"})
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["per_token_collapse"] == {"ok-c": {"c" * 64: 1}}


def test_voip_pushes_may_carry_5120_bytes_and_others_4096(sandbox: str) -> None:
    assert len(padded(5120)) == 5120
    assert apns(sandbox, "ok-voip", padded(5120), apns_push_type="voip").status_code == 200
    too_big = apns(sandbox, "ok-voip", padded(5121), apns_push_type="voip")
    assert (too_big.status_code, too_big.json()) == (413, {"reason": "PayloadTooLarge"})
    assert apns(sandbox, "ok-alert", padded(4096)).status_code == 200
    assert apns(sandbox, "ok-alert", padded(4097)).status_code == 413
    assert apns(sandbox, "ok-x", apns_topic="").json() == {"reason": "MissingTopic"}


def test_validate_only_validates_without_recording_a_delivery(sandbox: str) -> None:
    bearer = access_token(sandbox)
    message = {"token": "ok-dry", "notification": {"title": "T", "body": "B"}}
    dry = fcm(sandbox, bearer, message, validate_only=True)
    assert dry.json() == {"name": "projects/p/messages/fake_message_id"}
    gone = fcm(sandbox, bearer, {"token": "unregistered-dry"}, validateOnly=True)
    assert gone.status_code == 404  # token problems are found without sending
    flaky = fcm(sandbox, bearer, {"token": "flaky-dry"}, validate_only=True)
    assert flaky.status_code == 200  # and no one-shot failure is spent
    bad = fcm(
        sandbox, bearer, {"token": "ok-dry", "notification": {"titel": "T"}}, validate_only=True
    )
    assert bad.status_code == 400
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert (stats["deliveries"], stats["validated"], stats["requests"]) == (0, 2, 0)
    assert fcm(sandbox, bearer, {"token": "flaky-dry"}).status_code == 503  # the real send


def test_fid_topic_and_condition_targets_are_accepted_and_one_target_only(sandbox: str) -> None:
    bearer = access_token(sandbox)
    assert (
        fcm(sandbox, bearer, {"fid": "ok-fid-1", "notification": {"title": "T"}}).status_code == 200
    )
    assert fcm(sandbox, bearer, {"fid": "unregistered-fid"}).status_code == 404
    assert fcm(sandbox, bearer, {"topic": "news"}).status_code == 200
    assert fcm(sandbox, bearer, {"condition": "'a' in topics"}).status_code == 200
    two = fcm(sandbox, bearer, {"token": "ok-a", "fid": "ok-b"}).json()["error"]
    assert two["message"] == (
        "Invalid JSON payload received. Oneof field 'target' is already set. Cannot set 'fid'"
    )
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["per_token"] == {"ok-fid-1": 1, "topic:news": 1, "condition:'a' in topics": 1}


def test_unknown_fields_and_bad_values_are_refused_in_googles_words(sandbox: str) -> None:
    bearer = access_token(sandbox)
    answer = fcm(
        sandbox,
        bearer,
        {"token": "ok-u", "badge": 1, "android": {"notification": {"badge": "3"}}},
        dry=True,
    )
    error = answer.json()["error"]
    assert (answer.status_code, error["status"]) == (400, "INVALID_ARGUMENT")
    assert error["message"].split("\n") == [
        "Invalid JSON payload received. Unknown name \"badge\" at 'message': Cannot find field.",
        'Invalid JSON payload received. Unknown name "badge" at '
        "'message.android.notification': Cannot find field.",
        'Invalid JSON payload received. Unknown name "dry": Cannot find field.',
    ]
    [detail] = error["details"]
    assert detail["@type"] == BAD_REQUEST_TYPE
    assert [v.get("field") for v in detail["fieldViolations"]] == [
        "message",
        "message.android.notification",
        None,
    ]
    enum = fcm(sandbox, bearer, {"token": "ok-u", "android": {"priority": "urgent"}}).json()
    assert enum["error"]["message"] == (
        "Invalid value at 'message.android.priority' "
        '(type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority), "urgent"'
    )
    ttl = fcm(sandbox, bearer, {"token": "ok-u", "android": {"ttl": "3 days"}}).json()
    assert "google.protobuf.Duration" in ttl["error"]["message"]
    assert httpx.get(f"{sandbox}/sandbox/stats").json()["deliveries"] == 0


def test_json_names_null_fields_and_every_documented_field_are_accepted(sandbox: str) -> None:
    bearer = access_token(sandbox)
    message = {
        "token": "ok-full",
        "name": None,
        "data": {"k": "v"},
        "notification": {"title": "T", "body": "B", "image": "https://x/i.png"},
        "fcmOptions": {"analyticsLabel": "l"},
        "android": {
            "collapseKey": "req-1:dev-1",
            "priority": "high",
            "ttl": "3.5s",
            "restrictedPackageName": "com.example",
            "directBootOk": True,
            "notification": {
                "tag": "req-1:dev-1",
                "channelId": "c",
                "notificationPriority": "PRIORITY_HIGH",
                "visibility": "PUBLIC",
                "notificationCount": 3,
                "eventTime": "2026-11-22T10:00:00Z",
                "lightSettings": {
                    "color": {"red": 1, "green": 0.5, "blue": 0},
                    "lightOnDuration": "1s",
                    "lightOffDuration": "2s",
                },
                "vibrateTimings": ["0.5s", "1s"],
                "bodyLocArgs": ["a"],
            },
        },
        "apns": {"headers": {"apns-priority": "10"}, "payload": {"aps": {"badge": 1}}},
        "webpush": {"headers": {"TTL": "60"}, "notification": {"anything": ["goes"]}},
    }
    answer = fcm(sandbox, bearer, message)
    assert answer.status_code == 200, answer.text
    [delivery] = httpx.get(f"{sandbox}/sandbox/deliveries", params={"token": "ok-full"}).json()
    assert (delivery["collapse_id"], delivery["title"], delivery["data"]) == (
        "req-1:dev-1",
        "T",
        {"k": "v"},
    )


def test_the_fcm_collapse_id_is_the_collapse_key_else_the_notification_tag(sandbox: str) -> None:
    bearer = access_token(sandbox)
    fcm(
        sandbox,
        bearer,
        {"token": "ok-k", "android": {"collapse_key": "k1", "notification": {"tag": "t1"}}},
    )
    fcm(sandbox, bearer, {"token": "ok-k", "android": {"notification": {"tag": "t2"}}})
    fcm(sandbox, bearer, {"token": "ok-k", "notification": {"title": "plain"}})
    stats = httpx.get(f"{sandbox}/sandbox/stats").json()
    assert stats["per_token_collapse"] == {"ok-k": {"k1": 1, "t2": 1, "": 1}}
