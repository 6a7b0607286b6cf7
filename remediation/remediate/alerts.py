"""Firing alerts as a blocker: a host with a firing alert is left alone.

Asks Alertmanager's API v2 (its OpenAPI spec, ``api/v2/openapi.yaml``) for the alerts that fire and notify:
``GET {remediate.alertmanager_url}/api/v2/alerts?active=true&silenced=false&inhibited=false`` (a JSON array of
``gettableAlert``: ``labels``, ``annotations``, ``status.state``, ``startsAt`` ...). A silenced or inhibited alert is a
person's decision that it does not matter now; an active one does.

A host matches an alert when one of the alert's labels in ``remediate.alert_labels`` (default ``instance``,
``host``, ``node``) names it: equal to the inventory name, ``ansible_host``, ``k8s_node_name`` or
``azure_vm_name``, with or without a ``:port`` (Prometheus' ``instance`` is ``host:port``).

Fail closed: Alertmanager unreachable, slow (``remediate.alertmanager_timeout_s``), or answering anything but a JSON
array -> every host is blocked with that one line. An empty ``remediate.alertmanager_url`` checks nothing, and the
run's notes say so.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ALERTS_QUERY", "Alerts", "check_url", "fetch_alerts", "host_names", "match"]

ALERTS_QUERY = "/api/v2/alerts?active=true&silenced=false&inhibited=false"
DEFAULT_LABELS = ("instance", "host", "node")


@dataclass(frozen=True)
class Alerts:
    """What Alertmanager said: the firing alerts, or why they could not be read (``error``)."""

    alerts: tuple[Mapping[str, Any], ...] = ()
    error: str | None = None


def check_url(url: str) -> None:
    """A usable base URL, or :class:`~remediation.remediate.errors.RemediateError`."""
    from remediation.remediate.errors import RemediateError

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RemediateError(f"remediate.alertmanager_url {url!r} is not an http(s) URL")


def fetch_alerts(url: str, timeout: float = 5.0) -> Alerts:
    """The active, unsilenced, uninhibited alerts at Alertmanager ``url`` (its base URL)."""
    target = url.rstrip("/") + ALERTS_QUERY
    request = urllib.request.Request(target, headers={"Accept": "application/json"})  # noqa: S310 - http(s) only
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http(s) only
            doc = json.loads(response.read(8 << 20))
    except urllib.error.HTTPError as exc:
        return Alerts(error=f"Alertmanager {url}: HTTP {exc.code} {exc.reason}")
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", None) or exc
        return Alerts(error=f"Alertmanager {url} unreachable ({why})")
    except ValueError as exc:
        return Alerts(error=f"Alertmanager {url}: the answer is not JSON ({exc})")
    if not isinstance(doc, list):
        return Alerts(error=f"Alertmanager {url}: the answer is not a list of alerts")
    return Alerts(tuple(a for a in doc if isinstance(a, Mapping)))


def host_names(name: str, host_vars: Mapping[str, Any]) -> set[str]:
    """The names an alert may call this host by."""
    names = {name}
    for var in ("ansible_host", "k8s_node_name", "azure_vm_name"):
        value = host_vars.get(var)
        if isinstance(value, str) and value.strip():
            names.add(value.strip())
    return names


def _bare(value: str) -> str:
    if value.startswith("[") and "]" in value:  # [::1]:9100
        return value[1:value.index("]")]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def match(alerts: Iterable[Mapping[str, Any]], names: set[str], labels: Sequence[str] = DEFAULT_LABELS) -> str | None:
    """Why the host is blocked by a firing alert (the first few named), or None."""
    hits = []
    for alert in alerts:
        state = (alert.get("status") or {}).get("state", "active")
        if state != "active":
            continue
        got = alert.get("labels") or {}
        if any(isinstance(got.get(k), str) and (got[k] in names or _bare(got[k]) in names) for k in labels):
            what = str(got.get("alertname") or "alert")
            severity = got.get("severity")
            hits.append(f"{what}{f' ({severity})' if severity else ''}")
    if not hits:
        return None
    more = f" and {len(hits) - 3} more" if len(hits) > 3 else ""
    return f"firing alert: {', '.join(hits[:3])}{more} (Alertmanager): the next run looks again"
