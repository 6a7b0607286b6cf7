"""More bad input, through the task entry points in-process: refused before a client (or a login) is even made."""

from __future__ import annotations

from typing import Any

import pytest

from remediation.azure import run
from remediation.azure.errors import AzureInputError
from remediation.azure.settings import AzureSettings


def _never(settings: AzureSettings, subscription: str | None) -> Any:
    raise AssertionError("a client was made for bad input")


@pytest.mark.parametrize(
    ("call", "kwargs", "message"),
    [
        (run.quota_plan, {"location": "eastus", "vm_size": "Standard_X1", "nodes": 1}, "unknown GPU VM size"),
        (run.quota_plan, {"location": "eastus", "vm_size": "Standard_NC24ads_A100_v4", "nodes": 1, "gpus": 1},
         "give exactly one of --nodes N or --gpus N"),
        (run.quota_plan, {"location": "eastus", "vm_size": None, "nodes": 1}, "--vm-size is required"),
        (run.quota_show, {"location": "eastus", "threshold": "120"}, "--threshold 120 must be above 0"),
        (run.quota_show, {"location": "eastus", "threshold": "x"}, "--threshold 'x' is not a number"),
        (run.quota_show, {"location": None}, "--location is required"),
        (run.quota_request, {"location": "eastus", "family": None, "limit": 4}, "--family is required"),
        (run.quota_request, {"location": "eastus", "family": "cores", "limit": "1e3"}, "is not a whole number"),
        (run.pools, {"cluster": None, "resource_group": "rg"}, "--cluster is required"),
        (run.pools, {"cluster": "a/b", "resource_group": "rg"}, "is not a resource name"),
        (run.pools, {"cluster": "c", "resource_group": ""}, "--resource-group is required"),
    ],
)
def test_bad_input_never_makes_a_client(call: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(AzureInputError, match=message.replace("(", r"\(")):
        call(AzureSettings(), client_factory=_never, **kwargs)


def test_formats() -> None:
    assert run.check_format(None, ("table", "json")) == "table"
    assert run.check_format("JSON", ("table", "json")) == "json"
    with pytest.raises(AzureInputError, match="--format 'xml' is not one of table, json, prom"):
        run.check_format("xml", ("table", "json", "prom"))
