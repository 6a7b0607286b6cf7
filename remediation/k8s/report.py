"""What on-call reads: the Pending and latency diagnoses as text (rich console), and as JSON documents."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

from remediation.core import catalog

if TYPE_CHECKING:
    from rich.console import Console

    from remediation.core.findings import Finding
    from remediation.k8s.latency import LatencyDiagnosis
    from remediation.k8s.pending import PendingDiagnosis

__all__ = ["pending_json", "print_latency", "print_pending"]

_VERDICT = {
    "constraint": "CONSTRAINT: the pod spec keeps it off the nodes it needs",
    "capacity": "CAPACITY: the nodes it may use have no room, and the pool cannot add one",
    "node_state": "NODE STATE: the nodes it would use are broken, cordoned or going away",
    "ambiguous": "AMBIGUOUS: the message hides the taint key; a missing toleration or GPU capacity "
    "(--pod NAME --namespace NS or --snapshot DIR replays the filters on the nodes and decides)",
}


def _plain(console: Console, text: str = "", style: str | None = None) -> None:
    console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)


def _findings(console: Console, findings: tuple[Finding, ...]) -> None:
    for f in findings:
        entry = catalog.get(f.id)
        _plain(console)
        _plain(console, f"[{f.severity.value.upper()}] {f.id} ({f.scenario.value}) {entry.title}", style="bold")
        _plain(console, f"  {f.summary}")
        for line in f.evidence[:6]:
            _plain(console, f"    | {line}")
        _plain(console, f"  remedy: {f.remedy}")


def print_pending(d: PendingDiagnosis, console: Console) -> None:
    _plain(console, f"pod: {d.pod or '(from text)'}")
    if d.message is not None:
        _plain(console, f"scheduler: {d.message.text}")
    for m in d.events.autoscaler():
        _plain(console, f"autoscaler: {m.text}")
    verdict = _VERDICT.get(d.verdict or "", "no verdict: nothing in the input says why the pod waits")
    if d.fits_now:
        verdict = f"the pod fits on {', '.join(d.fits_now)} now"
    _plain(console, f"verdict: {verdict}", style="bold")
    if d.nodes:
        counts = Counter(r.reported[0].detail if r.reported else "fits" for r in d.nodes)
        _plain(console, f"nodes ({len(d.nodes)}), the scheduler's first failing filter on each:")
        for detail, count in counts.most_common():
            _plain(console, f"  {count} x {detail}")
    for note in d.notes:
        _plain(console, f"note: {note}")
    if d.fix is not None:
        _plain(console)
        _plain(
            console,
            f"fix (the evaluator schedules the patched pod on {d.scheduled_on}):" if d.scheduled_on else "fix:",
            style="bold",
        )
        for command in d.fix.commands:
            _plain(console, f"  {command}")
        _plain(console, "corrected pod spec:")
        for line in d.fix.yaml.splitlines():
            _plain(console, f"  {line}")
        _plain(console, "templates/k8s values (training-job, inference):")
        for line in d.fix.values.splitlines():
            _plain(console, f"  {line}")
    if d.capacity is not None:
        _plain(console)
        # the quota(s) that bind, by name: the family's, the regional total (cores) or lowPriorityCores (Spot)
        names = {"max_count": "the pool's maxCount", "quota": d.capacity.quota_names() or "the vCPU quota"}
        raise_ = (
            " and ".join(names[r] for r in d.capacity.raise_) or "(pool and quota facts: --pools FILE --usages FILE)"
        )
        _plain(console, f"capacity: raise {raise_}", style="bold")
        for line in d.capacity.lines:
            _plain(console, f"  {line}")
        for command in d.capacity.commands:
            _plain(console, f"  {command}")
    _findings(console, d.findings)


def pending_json(d: PendingDiagnosis) -> str:
    return json.dumps(d.to_dict(), indent=2, ensure_ascii=False)


def print_latency(d: LatencyDiagnosis, console: Console) -> None:
    _plain(console, f"pod: {d.pod} on node {d.node or '(none)'}")
    for r in d.restarts:
        _plain(
            console,
            f"restart: container {r.container} x{r.count}, last {r.reason}"
            + (f" (exit {r.exit_code})" if r.exit_code is not None else ""),
        )
    for disruption in d.disruptions:
        _plain(console, f"disrupted: {disruption.kind}: {disruption.detail}")
    if d.load is not None:
        seconds = f"{d.load.load_seconds:.1f} s" if d.load.load_seconds is not None else "unknown"
        _plain(console, f"model load: {seconds} ({d.load.server or 'unknown server'})")
    if d.throttled is not None:
        _plain(console, f"cpu throttled: {d.throttled:.0%} of CFS periods")
    for n in d.neighbours:
        _plain(
            console,
            f"neighbour: {n.pod}"
            + (f", throttled {n.throttled:.0%}" if n.throttled is not None else "")
            + ("" if n.cpu_limited else ", no CPU limit"),
        )
    for note in d.notes:
        _plain(console, f"note: {note}")
    _findings(console, d.findings)
    if d.fixes:
        from remediation.k8s.latency import merge_values

        _plain(console)
        _plain(console, "template values that apply the fixes (templates/k8s/inference):", style="bold")
        _plain(console, f"  # one values document for {', '.join(dict.fromkeys(fid for fid, _ in d.fixes))}")
        for line in merge_values(d.fixes).splitlines():  # each key once: a repeated key would drop the first
            _plain(console, f"  {line}")


def latency_json(d: LatencyDiagnosis) -> str:
    doc: dict[str, Any] = d.to_dict()
    return json.dumps(doc, indent=2, ensure_ascii=False)
