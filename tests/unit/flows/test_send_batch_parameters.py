"""send-batch's parameters as Prefect checks them: the form's schema and validation."""

from __future__ import annotations

import pytest
from prefect.exceptions import ParameterTypeError
from prefect.utilities.callables import parameter_schema

from campaign_trigger.flows import send_batch

BATCH = {"campaign_id": "demo-campaign", "csv_path": "incoming/orders.csv"}


@pytest.mark.parametrize("timeout", [0, -5])
def test_a_wait_timeout_not_above_zero_is_refused(timeout: float) -> None:
    with pytest.raises(ParameterTypeError, match="wait_timeout_seconds"):
        send_batch.validate_parameters({"batch": BATCH, "wait_timeout_seconds": timeout})


def test_a_positive_wait_timeout_is_taken() -> None:
    parameters = send_batch.validate_parameters({"batch": BATCH, "wait_timeout_seconds": 0.5})
    assert parameters["wait_timeout_seconds"] == 0.5


def test_the_form_schema_bounds_the_wait_timeout_and_keeps_its_help() -> None:
    schema = parameter_schema(send_batch.fn).model_dump_for_openapi()
    timeout = schema["properties"]["wait_timeout_seconds"]
    assert timeout["exclusiveMinimum"] == 0
    assert timeout["default"] == 3600
    assert timeout["description"] == "With wait: give up waiting for the report after this."
    assert schema["required"] == ["batch"]
