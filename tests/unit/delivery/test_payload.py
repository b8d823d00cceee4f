"""Payload building and the 4 KB rule."""

from __future__ import annotations

import json

import pytest

from campaign_trigger.delivery.base import MAX_PAYLOAD_BYTES, PushMessage
from campaign_trigger.delivery.payload import PayloadError, apns_body, fcm_body


def message(
    title: str = "Hello", body: str = "World", data: dict[str, str] | None = None
) -> PushMessage:
    return PushMessage(
        key=0,
        token="tok-1",
        title=title,
        body=body,
        data={"request_id": "r"} if data is None else data,
    )


def test_fcm_body_is_a_v1_message_with_token_notification_data_and_android() -> None:
    document = json.loads(fcm_body(message(title='Héllo "you"')))
    assert document == {
        "message": {
            "token": "tok-1",
            "notification": {"title": 'Héllo "you"', "body": "World"},
            "data": {"request_id": "r"},
            "android": {"priority": "high"},
        }
    }


def test_fcm_body_omits_empty_data_and_takes_android_options() -> None:
    document = json.loads(fcm_body(message(data={}), android={"ttl": "3600s"}))
    assert "data" not in document["message"]
    assert document["message"]["android"] == {"ttl": "3600s"}


def test_fcm_body_carries_the_collapse_identity_as_the_notification_tag() -> None:
    collapsing = PushMessage(key=0, token="t", title="a", body="b", data={}, collapse_id="0f" * 16)
    android = json.loads(fcm_body(collapsing))["message"]["android"]
    assert android == {"priority": "high", "notification": {"tag": "0f" * 16}}
    assert "collapse_key" not in android  # FCM drops all but four keys per offline device
    alone = json.loads(fcm_body(collapsing, android={}))["message"]["android"]
    assert alone == {"notification": {"tag": "0f" * 16}}


def test_apns_body_has_an_alert_and_the_data_at_top_level() -> None:
    document = json.loads(apns_body(message()))
    assert document == {
        "aps": {"alert": {"title": "Hello", "body": "World"}, "sound": "default"},
        "request_id": "r",
    }


@pytest.mark.parametrize("build", [apns_body, fcm_body])
def test_payload_of_exactly_the_limit_passes_and_one_byte_more_fails(build: object) -> None:
    assert callable(build)
    empty = (
        len(apns_body(message(body="")))
        if build is apns_body
        else len(
            json.dumps(
                {
                    "notification": {"title": "Hello", "body": ""},
                    "data": {"request_id": "r"},
                    "android": {"priority": "high"},
                },
                separators=(",", ":"),
            )
        )
    )
    fits = message(body="x" * (MAX_PAYLOAD_BYTES - empty))
    build(fits)
    with pytest.raises(PayloadError):
        build(message(body="x" * (MAX_PAYLOAD_BYTES - empty + 1)))


def test_size_counts_utf8_bytes_not_characters() -> None:
    with pytest.raises(PayloadError):
        apns_body(message(body="€" * 1400))  # 1400 characters, 4200 bytes
    apns_body(message(body="e" * 1400))


@pytest.mark.parametrize(
    "bad",
    [
        message(body="lone \ud800 surrogate"),
        message(data={"n": 1}),  # type: ignore[dict-item]
        message(data={"aps": "reserved"}),
        PushMessage(key=0, token="t", title=None, body="b", data={}),  # type: ignore[arg-type]
    ],
)
def test_unserialisable_messages_raise_payload_error(bad: PushMessage) -> None:
    with pytest.raises(PayloadError):
        apns_body(bad)
    if bad.data.get("aps") is None:
        with pytest.raises(PayloadError):
            fcm_body(bad)
