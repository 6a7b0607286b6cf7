"""``invoke aoai.*``: Azure OpenAI 429 storms (runbook S4): diagnose, alerts, APIM overflow, the local stand-in."""

from __future__ import annotations

from typing import Any

from invoke import Collection, Exit, task

from commands import edge, format_help, formats, read_input, required_flags, settings, shown
from remediation.core.exitcodes import ExitCode


def _cfg(c: Any) -> Any:
    from remediation.aoai.api import AoaiSettings

    return settings(c, AoaiSettings, "aoai")


def _number(flag: str, value: Any, kind: type = int) -> Any:
    from remediation.core.errors import UsageError

    try:
        return kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"{flag} {value!r}: a number") from None


def _write(out: str | None, content: str) -> None:
    from pathlib import Path

    from remediation.core.errors import UsageError

    if out is None:
        print(content, end="")
        return
    try:
        Path(out).write_text(content, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write: {exc.strerror}") from None


@task(
    default=True,
    positional=["file"],
    help={
        "file": "the client's request log (JSON lines), a response log (JSON lines with status, headers, usage) or "
        "an Azure Monitor metrics export (az monitor metrics list ... --output json); - for stdin",
        "format": format_help("text", "json"),
        "tpm_limit": "the deployment's tokens-per-minute quota (default aoai.tpm_limit) for peak-vs-limit",
        "deployment": "only this deployment (ModelDeploymentName)",
    },
)
@edge
@formats("text", "json")
def diagnose(c, file=None, format="text", tpm_limit=None, deployment=None):  # type: ignore[no-untyped-def]
    """429 storm from request logs or Azure Monitor metrics: share over time, Retry-After, peak TPM, the burst."""
    import json

    from remediation.aoai.api import analyse, render_analysis
    from remediation.core.errors import UsageError

    if format not in ("text", "json"):
        raise UsageError(f"--format {format!r} must be text or json")
    limit = None if tpm_limit is None else _number("--tpm-limit", tpm_limit)
    text, source = read_input(file, "aoai.diagnose")
    result = analyse(text, _cfg(c), tpm_limit=limit, deployment=deployment, source=source)
    print(json.dumps(result.to_dict(), indent=2) if format == "json" else render_analysis(result), end="")
    if format == "json":
        print()
    raise Exit(code=ExitCode.FINDINGS if result.findings else ExitCode.OK)


@task(
    help={
        "account_id": "resource ID of the Azure OpenAI account "
        "(/subscriptions/.../Microsoft.CognitiveServices/accounts/NAME)",
        "deployment": "the model deployment to watch",
        "tpm_limit": "its tokens-per-minute quota (default aoai.tpm_limit)",
        "action_group": "resource ID of the action group to notify (optional)",
        "out": "write the parameters file here (default: stdout)",
    }
)
@edge
def alerts(  # type: ignore[no-untyped-def]
    c, account_id=None, deployment=None, tpm_limit=None, action_group="", out=None
):
    """Azure Monitor alerts at 80% of TPM and on 429s: the parameters file for templates/azure/.

    --account-id and --deployment are required. Exit codes: 0, or 2 for a bad or missing value.
    """
    import sys

    from remediation.aoai.api import ALERTS_FILE, TEMPLATES, alert_parameters, render_json

    required_flags("aoai.alerts", account_id=account_id, deployment=deployment)
    cfg = _cfg(c)
    limit = _number("--tpm-limit", tpm_limit if tpm_limit is not None else cfg.tpm_limit)
    params = alert_parameters(account_id, deployment, limit, cfg, action_group)
    _write(out, render_json(params))
    template = shown(TEMPLATES / ALERTS_FILE)
    print(
        f"deploy: az deployment group create -g RESOURCE_GROUP --template-file {template} "
        f"--parameters @{out or 'PARAMETERS.json'}",
        file=sys.stderr,
    )


@task(
    help={
        "apim": "the API Management service name",
        "primary_url": "primary Azure OpenAI endpoint, https://NAME.openai.azure.com/openai",
        "secondary_url": "the overflow endpoint in another region (same deployment names)",
        "api": "the API in API Management that fronts Azure OpenAI",
        "out": "write the parameters file here (default: stdout)",
    }
)
@edge
def apim(  # type: ignore[no-untyped-def]
    c, apim=None, primary_url=None, secondary_url=None, api="azure-openai", out=None
):
    """APIM backend pool (two deployments, circuit breakers honouring Retry-After): the parameters file.

    --apim, --primary-url and --secondary-url are required. Exit codes: 0, or 2 for a bad or missing value.
    """
    import sys

    from remediation.aoai.api import APIM_FILE, TEMPLATES, apim_parameters, render_json

    required_flags("aoai.apim", apim=apim, primary_url=primary_url, secondary_url=secondary_url)
    _write(out, render_json(apim_parameters(apim, primary_url, secondary_url, api)))
    template = shown(TEMPLATES / APIM_FILE)
    print(
        f"deploy: az deployment group create -g RESOURCE_GROUP --template-file {template} "
        f"--parameters @{out or 'PARAMETERS.json'}",
        file=sys.stderr,
    )


@task(
    iterable=["deployment"],
    help={
        "deployment": "NAME:TPM[:RPM] (repeatable; default gpt-4o:80000)",
        "window": "seconds in the service's minute (60 = Azure; smaller to rehearse faster)",
        "huge_retry_after": "NAME[,NAME]: deployments whose every 429 says retry after 86400 seconds",
        "port": "port on 127.0.0.1 (0: any free one)",
        "duration": "stop after this many seconds",
    },
)
@edge
def fake(c, deployment=None, window=60.0, huge_retry_after=None, port=0, duration=600):  # type: ignore[no-untyped-def]
    """Serve the local Azure OpenAI stand-in on loopback (rehearsals, the README's examples); stops by itself."""
    import time

    from lab.services.aoai import FakeAzureOpenAI, FakeDeployment
    from remediation.core.errors import UsageError

    specs = list(deployment or ["gpt-4o:80000"])
    huge = set((huge_retry_after or "").split(",")) - {""}
    deployments = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[0]:
            raise UsageError(f"--deployment {spec!r}: NAME:TPM or NAME:TPM:RPM")
        rpm = _number("--deployment RPM", parts[2]) if len(parts) == 3 else None
        deployments.append(
            FakeDeployment(
                parts[0],
                _number("--deployment TPM", parts[1]),
                rpm,
                retry_after_override_s=86400.0 if parts[0] in huge else None,
            )
        )
    seconds = _number("--duration", duration, float)
    with FakeAzureOpenAI(deployments, window_s=_number("--window", window, float), port=_number("--port", port)) as svc:
        names = ", ".join(f"{d.name} ({d.tpm} TPM, {d.requests_per_minute} RPM)" for d in deployments)
        print(f"fake Azure OpenAI at {svc.url}: {names}; stops in {seconds:g} s (Ctrl-C to stop now)", flush=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


ns: Any = Collection("aoai", diagnose, alerts, apim, fake)
