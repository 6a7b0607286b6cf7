"""Escalation: the page (Alertmanager webhook payload v4, stable dedupe key, bounded retry, no secret in any error),
the receiver stand-in (idempotent under duplicate deliveries), and the packet (evidence from the facts, the Guest
Health Reporting category of each finding). The receiver listens on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.services.alert_webhook import AlertReceiver, validate_payload
from remediation.core.checks import Policy, run_checks
from remediation.core.facts import HostFacts, facts_from_dict
from remediation.core.findings import Finding, make_finding
from remediation.escalation import EscalationError
from remediation.escalation import packet as pk
from remediation.escalation.page import build_payload, check_url, dedupe_key, redact, send_page

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
NOW = _dt.datetime(2026, 3, 2, 3, 0, tzinfo=_dt.UTC)
BOOT = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
TOKEN = "s3cr3t-page-token-9f2c"  # noqa: S105 - a test token
RID = "/subscriptions/0c4f6b2a-8e1d-4a3b-9c5d-7e6f8a9b0c1d/resourceGroups/rg/providers/Microsoft.Compute/" \
      "virtualMachines/gpu-vm-2"


def _facts(name: str) -> HostFacts:
    return facts_from_dict(json.loads((FIXTURES / f"{name}.json").read_text()))


def _findings(name: str) -> dict[str, Finding]:
    return {f.id: f for f in run_checks(_facts(name), Policy())}


def _finding(fid: str = "GPU-HW-001", summary: str = "GPU 3 lost (fallen off the bus)", host: str = "gpu-2",
             evidence: tuple[str, ...] = ("NVRM: Xid (PCI:0003:00:00): 79, GPU has fallen off the bus.",)) -> Finding:
    return make_finding(fid, summary, evidence, host=host)


@pytest.fixture
def receiver() -> Iterator[AlertReceiver]:
    with AlertReceiver(token=TOKEN) as rx:
        yield rx


# --- the page -------------------------------------------------------------------------------------------------------


def test_the_dedupe_key_is_stable_per_host_finding_and_boot() -> None:
    key = dedupe_key("gpu-2", "GPU-HW-001", BOOT)
    assert key == dedupe_key("gpu-2", "GPU-HW-001", BOOT) and len(key) == 16 and int(key, 16) >= 0
    others = {dedupe_key("gpu-3", "GPU-HW-001", BOOT), dedupe_key("gpu-2", "GPU-HW-003", BOOT),
              dedupe_key("gpu-2", "GPU-HW-001", "another-boot"), dedupe_key("gpu-2", "GPU-HW-001", BOOT, "Xid 94")}
    assert len(others | {key}) == 5
    a = build_payload(_finding(summary="first wording"), boot_id=BOOT, detected_at=NOW)
    b = build_payload(_finding(summary="other wording"), boot_id=BOOT, detected_at=NOW + _dt.timedelta(hours=3))
    assert a["alerts"][0]["fingerprint"] == b["alerts"][0]["fingerprint"] == key
    assert a["groupKey"] == b["groupKey"] and key in a["groupKey"]


def test_the_payload_is_alertmanager_version_4() -> None:
    payload = build_payload(_finding(), boot_id=BOOT, detected_at=NOW, fleet="gpu")
    assert validate_payload(payload) is None
    assert payload["version"] == "4" and payload["status"] == "firing" and payload["truncatedAlerts"] == 0
    alert = payload["alerts"][0]
    assert alert["startsAt"] == "2026-03-02T03:00:00Z" and alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert alert["labels"] == {"alertname": "GpuFleetEscalation", "host": "gpu-2", "finding_id": "GPU-HW-001",
                               "severity": "critical", "scenario": "S1", "dedupe_key": alert["fingerprint"],
                               "boot_id": BOOT, "fleet": "gpu"}
    assert "fallen off the bus" in alert["annotations"]["description"]
    with pytest.raises(EscalationError, match="no host"):
        build_payload(_finding(host=""), boot_id=BOOT)


def test_evidence_is_bounded_and_control_characters_go() -> None:
    finding = _finding(evidence=("\x1b[31mred\x07", *("x" * 1000 for _ in range(20))))
    description = build_payload(finding, boot_id=BOOT, detected_at=NOW)["alerts"][0]["annotations"]["description"]
    assert "\x1b" not in description and len(description) <= 4096 + 4


def test_a_page_is_delivered_once_however_often_it_is_sent(receiver: AlertReceiver) -> None:
    payload = build_payload(_finding(), boot_id=BOOT, detected_at=NOW)
    for _ in range(3):
        result = send_page(receiver.webhook_url, payload, token=TOKEN)
        assert result.delivered and result.status == 200 and result.attempts == 1
    again = build_payload(_finding(summary="reworded"), boot_id=BOOT, detected_at=NOW + _dt.timedelta(hours=1))
    assert send_page(receiver.webhook_url, again, token=TOKEN).delivered
    assert len(receiver.deliveries) == 4 and len(receiver.pages) == 1
    page = receiver.pages[0]
    assert page.labels["finding_id"] == "GPU-HW-001" and page.fingerprint == dedupe_key("gpu-2", "GPU-HW-001", BOOT)
    assert receiver.authorizations[-1] == f"Bearer {TOKEN}"
    resolved = dict(payload, status="resolved", alerts=[dict(payload["alerts"][0], status="resolved")])
    assert send_page(receiver.webhook_url, resolved, token=TOKEN).delivered
    assert [p.status for p in receiver.pages] == ["firing", "resolved"]
    other_boot = build_payload(_finding(), boot_id="new-boot", detected_at=NOW)
    assert send_page(receiver.webhook_url, other_boot, token=TOKEN).delivered and len(receiver.pages) == 3


def test_transient_failures_are_retried_a_bounded_number_of_times(receiver: AlertReceiver) -> None:
    payload = build_payload(_finding(), boot_id=BOOT, detected_at=NOW)
    waits: list[float] = []
    receiver.fail_next(2, 503)
    result = send_page(receiver.webhook_url, payload, token=TOKEN, attempts=3, backoff_s=0.5, sleep=waits.append)
    assert result.delivered and result.attempts == 3 and waits == [0.5, 1.0]
    receiver.fail_next(2, 429)
    failed = send_page(receiver.webhook_url, payload, token=TOKEN, attempts=2, backoff_s=0.1, sleep=waits.append)
    assert not failed.delivered and failed.attempts == 2 and failed.status == 429
    receiver.fail_next(1, 404)
    final = send_page(receiver.webhook_url, payload, token=TOKEN, attempts=5, sleep=waits.append)
    assert not final.delivered and final.attempts == 1 and final.status == 404  # not retried
    assert len(receiver.pages) == 1


def test_the_token_never_shows(receiver: AlertReceiver) -> None:
    payload = build_payload(_finding(), boot_id=BOOT, detected_at=NOW)
    wrong = send_page(receiver.webhook_url, payload, token="wrong-" + TOKEN, attempts=1)
    assert not wrong.delivered and wrong.status == 401 and TOKEN not in (wrong.error or "")
    dead = send_page("http://127.0.0.1:1/alerts", payload, token=TOKEN, attempts=2, sleep=lambda s: None)
    assert not dead.delivered and dead.status is None and dead.attempts == 2 and TOKEN not in repr(dead)
    assert redact(f"Authorization: Bearer {TOKEN} failed", TOKEN) == "Authorization: Bearer *** failed"
    assert redact("header was Bearer abc.def", None) == "header was Bearer ***"


def test_unusable_settings_refuse_before_sending() -> None:
    with pytest.raises(EscalationError, match="only sent over https"):
        check_url("http://alerts.example.net/hook", TOKEN)
    assert check_url("https://alerts.example.net/hook", TOKEN)
    assert check_url("http://127.0.0.1:9/hook", TOKEN)
    with pytest.raises(EscalationError, match="credentials") as caught:
        check_url(f"https://user:{TOKEN}@alerts.example.net/hook")
    assert TOKEN not in str(caught.value)
    for bad in ("ftp://x/", "alerts", "http://"):
        with pytest.raises(EscalationError):
            check_url(bad)
    payload = build_payload(_finding(), boot_id=BOOT, detected_at=NOW)
    with pytest.raises(EscalationError, match="attempts"):
        send_page("http://127.0.0.1:9/", payload, attempts=0)


def test_the_receiver_refuses_what_is_not_a_v4_payload(receiver: AlertReceiver) -> None:
    payload = build_payload(_finding(), boot_id=BOOT, detected_at=NOW)
    assert validate_payload(dict(payload, version="3")) is not None
    assert validate_payload({k: v for k, v in payload.items() if k != "groupKey"}) == "no groupKey"
    assert validate_payload(dict(payload, alerts=[{"status": "firing"}])) is not None
    bad = send_page(receiver.webhook_url, dict(payload, version="3"), token=TOKEN, attempts=3)
    assert not bad.delivered and bad.status == 400 and bad.attempts == 1 and receiver.pages == []


# --- the packet -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fixture", "fid", "category"), [
    ("xid79_lost", "GPU-HW-001", "Resource.Hpc.Unhealthy.XID79FallenOffBus"),
    ("ecc_pending_remap", "GPU-HW-004", "Resource.Hpc.Unhealthy.HpcRowRemapFailure"),
    ("ecc_pending_remap", "GPU-HW-005", "Resource.Hpc.Unhealthy.GpuXIDError"),  # Xid 63
    ("ecc_pending_remap", "GPU-HW-003", "Resource.Hpc.Unhealthy.HpcGenericFailure"),
])
def test_the_audits_findings_map_to_documented_categories(fixture: str, fid: str, category: str) -> None:
    impact = pk.impact_category(_findings(fixture)[fid])
    assert impact.category == category and impact.file_with_azure


@pytest.mark.parametrize(("code", "category"), [
    (48, "Resource.Hpc.Unhealthy.XID48DoubleBitECC"),
    (79, "Resource.Hpc.Unhealthy.XID79FallenOffBus"),
    (94, "Resource.Hpc.Unhealthy.XID94ContainedECCError"),
    (95, "Resource.Hpc.Unhealthy.XID95UncontainedECCError"),
    (31, "Resource.Hpc.Unhealthy.GpuXIDError"),
])
def test_xid_findings_map_by_code(code: int, category: str) -> None:
    finding = make_finding("GPU-HW-005", f"Xid {code} on 0000:cb:00: something", [], host="gpu-2")
    assert pk.impact_category(finding).category == category


def test_other_findings_map_to_their_category_or_the_generic_one() -> None:
    def cat(fid: str, evidence: tuple[str, ...] = ()) -> pk.Impact:
        return pk.impact_category(make_finding(fid, "s", evidence, host="h"))

    assert cat("GPU-HW-002").category == "Resource.Hpc.Unhealthy.HpcMissingGpu"
    assert cat("GPU-HW-007").category == "Resource.Hpc.Unhealthy.HpcMissingGpu"
    assert cat("GPU-DRV-006").category == "Resource.Hpc.Unhealthy.UnhealthyGPUNvidiasmi"
    assert cat("GPU-HW-004", ("double-bit retired pages 12 > 10 (DCGM limit)",)).category == \
        "Resource.Hpc.Unhealthy.DBEOverLimit"
    assert cat("GPU-HW-004", ("retired pages 70 >= 64 (DCGM limit)",)).category == \
        "Resource.Hpc.Unhealthy.ECCPageRetirementTableFull"
    driver = cat("GPU-DRV-001")
    assert driver.category == pk.GENERIC_CATEGORY and not driver.file_with_azure
    assert "not a platform fault" in driver.why
    every = {pk.GENERIC_CATEGORY, pk.XID_OTHER_CATEGORY, *pk.XID_CATEGORIES.values(), *pk.IMPACT_CATEGORIES.values()}
    assert all(c.startswith("Resource.Hpc.Unhealthy.") for c in every)


def test_the_packet_carries_the_evidence_and_the_guest_health_report() -> None:
    facts = _facts("xid79_lost")
    finding = _findings("xid79_lost")["GPU-HW-001"]
    packet = pk.build_packet(finding, facts, now=NOW, resource_id=RID, incident_markdown="# Incident\n",
                             vm_unique_id="d3e0e374-fda6-4649-bbc9-7f20dc379f34")
    assert packet["schema"] == "gpufleet.escalation/1" and packet["boot_id"] == BOOT
    assert packet["dedupe_key"] == dedupe_key(finding.host or "", "GPU-HW-001", BOOT)
    evidence = packet["evidence"]
    assert evidence["system"]["boot_id"] == BOOT and evidence["nvml"]["gpus"]
    assert any("fallen off the bus" in line or ": 79" in line for line in evidence["xid_lines"])
    assert isinstance(evidence["holds"], list) and "dkms_status" in evidence
    ghr = packet["guest_health_report"]
    assert ghr["file_with_azure"] and ghr["method"] == "PUT" and ghr["api_version"] == "2023-02-01-preview"
    assert ghr["path"] == ("/subscriptions/0c4f6b2a-8e1d-4a3b-9c5d-7e6f8a9b0c1d/providers/Microsoft.Impact/"
                           f"workloadImpacts/gpufleet-{packet['dedupe_key']}")
    props = ghr["body"]["properties"]
    assert props["impactCategory"] == "Resource.Hpc.Unhealthy.XID79FallenOffBus"
    assert props["impactedResourceId"] == RID and props["startDateTime"].endswith("Z")
    assert props["additionalProperties"] == {"VmUniqueId": "d3e0e374-fda6-4649-bbc9-7f20dc379f34"}
    json.dumps(packet)  # JSON-ready throughout


def test_a_packet_without_facts_or_resource_id_says_what_is_missing() -> None:
    packet = pk.build_packet(_finding(), None, now=NOW)
    assert packet["evidence"] is None and "could not be collected" in packet["evidence_missing"]
    assert packet["guest_health_report"]["path"] is None
    assert "azure_vm_resource_id" in packet["guest_health_report"]["missing"][0]
    with pytest.raises(EscalationError):
        pk.build_packet(_finding(host=""), None, now=NOW)


def test_evidence_is_bounded() -> None:
    facts = _facts("xid79_lost")
    huge = dataclasses.replace(facts, dkms_status="nvidia/535, 6.5.0: installed\n" * 10_000)
    packet = pk.build_packet(_finding(), huge, now=NOW)
    assert len(packet["evidence"]["dkms_status"]) < 17_000 and packet["evidence"]["dkms_status"].endswith("(truncated)")


def test_write_packet_directory_and_tarball(tmp_path: Path) -> None:
    packet = pk.build_packet(_findings("xid79_lost")["GPU-HW-001"], _facts("xid79_lost"), now=NOW,
                             resource_id=RID, incident_markdown="# Incident\n")
    out = pk.write_packet(packet, tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["guest-health-report.json", "incident.md", "packet.json"]
    assert json.loads((out / "packet.json").read_text()) == packet
    tar = pk.write_packet(packet, tmp_path / "t", tarball=True)
    with tarfile.open(tar) as archive:
        names = archive.getnames()
    assert tar.name.endswith(".tar.gz") and len(names) == 3 and all(n.startswith(out.name + "/") for n in names)
    assert pk.write_packet(packet, tmp_path / "u", tarball=True).read_bytes() == tar.read_bytes()  # reproducible


def test_hostile_names_stay_inside_the_directory(tmp_path: Path) -> None:
    packet: dict[str, Any] = pk.build_packet(_finding(host="../../etc/x"), None, now=NOW)
    out = pk.write_packet(packet, tmp_path)
    assert out.parent == tmp_path and out.name.startswith("etc_x-GPU-HW-001-")
