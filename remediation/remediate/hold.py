"""What the loop checks and holds around acting on a batch: cordons (:mod:`.cordon`), firing alerts (:mod:`.alerts`)
and AKS node auto-repair (:mod:`.aks`).

:func:`remediation.remediate.act.act` makes one :class:`FleetHold` per run (its run id names the cordons it sets) and
calls, per batch:

1. :meth:`FleetHold.check` before the blockers: host -> why it is left alone (someone else's cordon, the loop's
   own from an earlier run, a firing alert, Alertmanager not answering, AKS auto-repair, the node unreadable);
2. :meth:`FleetHold.cordon` on the hosts about to be acted on: the loop's own cordon set (a host whose cordon
   cannot be set, or where someone else's appeared meanwhile, is left alone);
3. :meth:`FleetHold.release` after the gate passed, or when the action did not start: this run's cordon removed;
   after a failed gate or a broken action the host stays cordoned (:meth:`FleetHold.kept` says so).

:class:`NoHold` checks and holds nothing (tests of the loop's other rules).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from remediation.remediate.cordon import (
    Kind,
    cordon_patch,
    cordon_vms,
    is_aks,
    marker,
    node_cordon,
    uncordon_patch,
    uncordon_vms,
    vm_cordon,
)

if TYPE_CHECKING:
    from remediation.config import RemediateSettings
    from remediation.host.audit import AuditOptions
    from remediation.remediate.aks import NodeApi
    from remediation.remediate.alerts import Alerts
    from remediation.remediate.plan import Decision
    from remediation.transport.inventory import Host

__all__ = ["FleetHold", "NoHold", "reason_for"]


def reason_for(name: str, decisions: Sequence[Decision]) -> tuple[str, tuple[str, ...]]:
    """The cordon's reason and findings: what the loop is about to do on the host."""
    ids = tuple(dict.fromkeys(d.finding for d in decisions))
    actions = sorted({d.action.value for d in decisions if d.action})
    return f"invoke remediate: {', '.join(actions) or 'action'} for {', '.join(ids)} on {name}", ids


class NoHold:
    """Checks nothing, cordons nothing."""

    def __init__(self, run_id: str = "test-run") -> None:
        self.run_id = run_id
        self.notes: tuple[str, ...] = ()

    def check(self, hosts: Sequence[Host]) -> dict[str, str]:
        return {}

    def cordon(self, hosts: Sequence[Host], decisions: Mapping[str, Sequence[Decision]]) -> dict[str, str]:
        return {}

    def release(self, hosts: Sequence[Host]) -> dict[str, str]:
        return {}

    def kept(self, name: str) -> str:
        return ""


class FleetHold:
    """The real checks and cordons (see the module docstring)."""

    def __init__(
        self,
        cfg: RemediateSettings,
        hosts: Sequence[Host],
        options: AuditOptions,
        run_id: str,
        clock: Callable[[], _dt.datetime],
        *,
        fetch: Callable[..., Alerts] | None = None,
        node_api: Callable[[], NodeApi] | None = None,
    ) -> None:
        from remediation.remediate.alerts import check_url, fetch_alerts

        self.cfg, self.options, self.run_id, self.clock = cfg, options, run_id, clock
        self.url = cfg.alertmanager_url.strip()
        if self.url:
            check_url(self.url)
        self.fetch = fetch or fetch_alerts
        self._node_api = node_api
        self._api: NodeApi | None = None
        self.set: dict[str, str] = {}  # host -> where this run's cordon is ("marker" | "node <name>")
        notes = []
        if not self.url:
            notes.append("firing alerts not checked (remediate.alertmanager_url is empty)")
        if not any(is_aks(h.vars) for h in hosts):
            notes.append("no AKS node in the inventory (k8s_node_name): AKS auto-repair not checked")
        self.notes = tuple(notes)

    # --- AKS -----------------------------------------------------------------------------------------------------

    def api(self) -> NodeApi:
        if self._api is None:
            if self._node_api is not None:
                self._api = self._node_api()
            else:
                from remediation.remediate.aks import NodeApi

                self._api = NodeApi(self.cfg.kubeconfig, self.cfg.kube_context, self.cfg.kube_timeout_s)
        return self._api

    def close(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None

    @staticmethod
    def node_of(host: Host) -> str:
        return str(host.vars.get("k8s_node_name") or "").strip()

    def _node_reasons(self, hosts: Sequence[Host]) -> dict[str, list[str]]:
        from remediation.core.errors import RemediationError
        from remediation.remediate.aks import auto_repair

        out: dict[str, list[str]] = {}
        for h in hosts:
            node = self.node_of(h)
            try:
                api = self.api()
                c = node_cordon(api.node(node), self.run_id)
                why = [c.blocks] if c.blocks else []
                repair = auto_repair(api.events(node), self.clock(), self.cfg.auto_repair_window_s)
                if repair:
                    why.append(repair)
            except RemediationError as exc:
                why = [f"node {node} not readable: {exc}: nothing is changed without it"]
            if why:
                out[h.name] = why
        return out

    # --- the three steps -----------------------------------------------------------------------------------------

    def check(self, hosts: Sequence[Host]) -> dict[str, str]:
        """host -> why it is left alone (one line; the hosts not named may be acted on)."""
        from remediation.rollout.cordon import cordon_markers

        reasons: dict[str, list[str]] = {}
        vms = [h for h in hosts if not is_aks(h.vars)]
        aks = [h for h in hosts if is_aks(h.vars)]
        if vms:
            markers = cordon_markers(vms, self.options)
            for h in vms:
                c = vm_cordon(h.vars, markers.get(h.name), self.run_id)
                if c.blocks:
                    reasons.setdefault(h.name, []).append(c.blocks)
        for name, why in self._node_reasons(aks).items():
            reasons.setdefault(name, []).extend(why)
        if self.url:
            from remediation.remediate.alerts import host_names, match

            got = self.fetch(self.url, timeout=self.cfg.alertmanager_timeout_s)
            for h in hosts:
                if got.error:
                    fired: str | None = f"firing alerts unknown: {got.error}: nothing is changed without them"
                else:
                    fired = match(got.alerts, host_names(h.name, h.vars), self.cfg.alert_labels)
                if fired:
                    reasons.setdefault(h.name, []).append(fired)
        return {name: "; ".join(why) for name, why in reasons.items()}

    def cordon(self, hosts: Sequence[Host], decisions: Mapping[str, Sequence[Decision]]) -> dict[str, str]:
        """Set this run's cordon on ``hosts``; host -> why it could not be set (the host is left alone)."""
        from remediation.core.errors import RemediationError

        now = self.clock()
        failed: dict[str, str] = {}
        vms = [h for h in hosts if not is_aks(h.vars)]
        if vms:
            records = {}
            for h in vms:
                reason, ids = reason_for(h.name, decisions[h.name])
                records[h.name] = marker(self.run_id, reason, ids, now)
            for name, why in cordon_vms(vms, records, self.options).items():
                if why is None:
                    self.set[name] = "marker"
                else:
                    failed[name] = why
        for h in hosts:
            if not is_aks(h.vars):
                continue
            node = self.node_of(h)
            reason, _ids = reason_for(h.name, decisions[h.name])
            try:
                api = self.api()
                obj = api.node(node)
                c = node_cordon(obj, self.run_id)
                if c.blocks:
                    failed[h.name] = c.blocks
                    continue
                if c.kind is Kind.NONE:
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    api.patch(node, cordon_patch(self.run_id, reason, now, rv))
                self.set[h.name] = f"node {node}"
            except RemediationError as exc:
                failed[h.name] = f"could not cordon node {node}: {exc}"
        return failed

    def release(self, hosts: Sequence[Host]) -> dict[str, str]:
        """Remove this run's cordon from ``hosts`` (only where this run set it); host -> what happened."""
        from remediation.core.errors import RemediationError

        mine = [h for h in hosts if h.name in self.set]
        out = uncordon_vms([h for h in mine if self.set[h.name] == "marker"], self.run_id, self.options)
        for h in mine:
            if self.set[h.name] == "marker":
                continue
            node = self.node_of(h)
            try:
                api = self.api()
                obj = api.node(node)
                c = node_cordon(obj, self.run_id)
                if c.kind is Kind.OURS:
                    api.patch(node, uncordon_patch((obj.get("metadata") or {}).get("resourceVersion")))
                    out[h.name] = f"uncordoned (node {node}: spec.unschedulable and our annotations removed)"
                elif c.kind is Kind.NONE:
                    out[h.name] = f"no cordon left to remove (node {node} schedulable)"
                else:
                    out[h.name] = f"cordon kept: node {node} is no longer ours ({c.blocks})"
            except RemediationError as exc:
                out[h.name] = f"still cordoned: could not uncordon node {node} ({exc})"
        for h in mine:
            if not out.get(h.name, "").startswith("still cordoned"):
                self.set.pop(h.name, None)
        return out

    def kept(self, name: str) -> str:
        """What stays after a failed gate or a broken action: this run's cordon, for a person to lift."""
        where = self.set.get(name)
        if where is None:
            return ""
        what = "the marker /etc/gpufleet/cordoned" if where == "marker" else where
        return f"left cordoned ({what}, ours): a person checks the host and removes the cordon"
