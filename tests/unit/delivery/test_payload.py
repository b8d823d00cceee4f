"""Payload building and the 4 KB rule."""

from __future__ import annotations

import json

import pytest

from campaign_trigger.delivery.base import MAX_PAYLOAD_BYTES, PushMessage, PushOptions
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


def test_fcm_body_omits_empty_data_and_takes_the_campaigns_options() -> None:
    timed = PushMessage(
        key=0, token="t", title="a", body="b", data={}, options=PushOptions(ttl_seconds=3600)
    )
    document = json.loads(fcm_body(timed))
    assert "data" not in document["message"]
    assert document["message"]["android"] == {"priority": "high", "ttl": "3600s"}


def test_fcm_body_carries_the_collapse_identity_as_the_notification_tag() -> None:
    collapsing = PushMessage(key=0, token="t", title="a", body="b", data={}, collapse_id="0f" * 16)
    android = json.loads(fcm_body(collapsing))["message"]["android"]
    assert android == {"priority": "high", "notification": {"tag": "0f" * 16}}
    assert "collapse_key" not in android  # FCM drops all but four keys per offline device


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


FULL = PushOptions(
    priority="normal",
    ttl_seconds=300,
    sound="chime.caf",
    badge=3,
    interruption_level="time-sensitive",
    thread_id="orders",
    category="ORDER",
)


def full(options: PushOptions = FULL) -> PushMessage:
    return PushMessage(
        key=0,
        token="t",
        title="Code",
        body="123456",
        data={"link": "app://orders/7"},
        collapse_id="c1",
        image="https://cdn.example/7.png",
        options=options,
    )


def test_every_campaign_field_has_its_fcm_v1_name() -> None:
    document = json.loads(fcm_body(full()))
    assert document == {
        "message": {
            "token": "t",
            "notification": {
                "title": "Code",
                "body": "123456",
                "image": "https://cdn.example/7.png",
            },
            "data": {"link": "app://orders/7", "message_id": "c1"},
            "android": {
                "priority": "normal",
                "ttl": "300s",
                "notification": {
                    "sound": "chime.caf",
                    "notification_count": 3,
                    "click_action": "ORDER",
                    "notification_priority": "PRIORITY_HIGH",
                    "tag": "c1",
                },
            },
        }
    }


def test_every_campaign_field_has_its_apns_name() -> None:
    document = json.loads(apns_body(full()))
    assert document == {
        "aps": {
            "alert": {"title": "Code", "body": "123456"},
            "sound": "chime.caf",
            "badge": 3,
            "thread-id": "orders",
            "category": "ORDER",
            "interruption-level": "time-sensitive",
            "mutable-content": 1,
        },
        "image": "https://cdn.example/7.png",
        "link": "app://orders/7",
        "message_id": "c1",
    }


def test_a_silent_push_is_data_only_on_fcm_and_content_available_on_apns() -> None:
    silent = PushMessage(
        key=0,
        token="t",
        title="",
        body="",
        data={"sync": "orders"},
        collapse_id="c1",
        options=PushOptions(silent=True, priority="normal", ttl_seconds=60),
    )
    assert json.loads(fcm_body(silent))["message"] == {
        "token": "t",
        "data": {"sync": "orders", "message_id": "c1"},
        "android": {"priority": "normal", "ttl": "60s"},
    }
    assert json.loads(apns_body(silent)) == {
        "aps": {"content-available": 1},
        "sync": "orders",
        "message_id": "c1",
    }


def test_every_push_names_its_message_for_the_app_to_drop_a_second_copy() -> None:
    # A silent push has no notification for a tag or apns-collapse-id to replace: a retry
    # after a timeout (the provider may have taken the first) reaches the app twice, and
    # only an identity in the payload lets it drop the second.
    for silent in (True, False):
        options = PushOptions(silent=silent)
        sent = [
            PushMessage(
                key=0,
                token="t",
                title="",
                body="" if silent else "b",
                data={},
                collapse_id="0f" * 16,
                options=options,
            )
            for _ in range(2)
        ]
        assert [json.loads(fcm_body(m))["message"]["data"] for m in sent] == [
            {"message_id": "0f" * 16}
        ] * 2
        assert {json.loads(apns_body(m))["message_id"] for m in sent} == {"0f" * 16}
    own = PushMessage(
        key=0, token="t", title="a", body="b", data={"message_id": "m7"}, collapse_id="c"
    )
    assert json.loads(fcm_body(own))["message"]["data"] == {"message_id": "m7"}
    assert json.loads(apns_body(own))["message_id"] == "m7"


def test_the_image_key_is_taken_in_apns_payloads() -> None:
    clash = PushMessage(
        key=0, token="t", title="a", body="b", data={"image": "x"}, image="https://i/x.png"
    )
    with pytest.raises(PayloadError):
        apns_body(clash)
