"""The S4 demo scene checks itself; the aoai.* tasks and `invoke diagnose` at the command line (exit codes, one-line
errors)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from demo import SceneContext
from demo.aoai import SCENE

ROOT = Path(__file__).resolve().parents[2]
INVOKE = [sys.executable, "-m", "invoke"]
ACCOUNT = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.CognitiveServices/accounts/contoso"


def test_scene_shows_what_it_should(tmp_path: Path) -> None:
    console = Console(file=(tmp_path / "scene.txt").open("w"), width=140)
    ctx = SceneContext(console=console, root=ROOT, lab=None, hosts=0)  # type: ignore[arg-type]  # no lab needed
    passed = SCENE.run(ctx)
    console.file.close()
    shown = (tmp_path / "scene.txt").read_text()
    assert passed is True, [line for line in shown.splitlines() if line.startswith("check failed: ")] or shown[-3000:]
    assert "check failed" not in shown
    for text in ("AOAI-429-001", "AOAI-TPM-001", "aoai-429", "cooled ['gpt-4o-eastus']", "TokenTransaction"):
        assert text in shown


def invoke(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INVOKE, *args], cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def test_aoai_diagnose_task(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    lines = [
        {
            "ts": 1_721_030_400 + i,
            "status": 429 if i % 2 else 200,
            "usage": {"total_tokens": 3000},
            "headers": {"retry-after": "31"},
        }
        for i in range(40)
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines))
    done = invoke("aoai.diagnose", str(log), "--tpm-limit", "80000", "--format", "json")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["kind"] == "aoai-requests" and doc["facts"]["share_429_pct"] == 50.0
    assert {f["id"] for f in doc["findings"]} == {"AOAI-429-001", "AOAI-TPM-001"}
    bad = invoke("aoai.diagnose", str(tmp_path / "missing.jsonl"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "cannot read" in bad.stderr
    junk = invoke("aoai.diagnose", "-", stdin="hello\n")
    assert junk.returncode == 2 and "no request records" in junk.stderr


def test_alerts_and_apim_tasks(tmp_path: Path) -> None:
    out = tmp_path / "alerts.parameters.json"
    done = invoke(
        "aoai.alerts", "--account-id", ACCOUNT, "--deployment", "gpt-4o-prod", "--tpm-limit", "80000", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["parameters"]["tpmLimit"]["value"] == 80000
    assert "templates/azure/aoai-metric-alerts.json" in done.stderr
    refused = invoke("aoai.alerts", "--account-id", "nope", "--deployment", "d", "--tpm-limit", "1")
    assert refused.returncode == 2 and refused.stderr.startswith("error: --account-id 'nope'")
    apim = invoke(
        "aoai.apim",
        "--apim",
        "apim-prod",
        "--primary-url",
        "https://a.openai.azure.com/openai",
        "--secondary-url",
        "https://b.openai.azure.com/openai",
    )
    assert apim.returncode == 0 and json.loads(apim.stdout)["parameters"]["apimServiceName"]["value"] == "apim-prod"


def test_invoke_diagnose_kind_aoai_429() -> None:
    pasted = (
        "openai.RateLimitError: Error code: 429 - {'error': {'code': '429', 'message': 'Requests to the "
        "ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate "
        "limit of your current OpenAI S0 pricing tier. Please retry after 86400 seconds.'}}"
    )
    done = invoke("diagnose", "-", "--format", "json", stdin=pasted)
    assert done.returncode == 1
    doc = json.loads(done.stdout)
    assert doc["kind"] == "aoai-429"
    assert (doc["facts"]["retry_after_seconds"], doc["facts"]["limit_kind"], doc["facts"]["deployment"]) == (
        86400.0,
        "tokens",
        None,
    )
    assert {f["id"] for f in doc["findings"]} == {"AOAI-429-001", "AOAI-429-002"}
