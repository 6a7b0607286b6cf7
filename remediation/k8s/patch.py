"""The fix of a constrained pod as data: JSON patches (RFC 6902) for the pod and its controller, the ``kubectl
patch`` commands that send them, and the corrected YAML.

- The pod itself: only tolerations may be *added* to a running pod's spec (the API server refuses every other
  change to ``spec``), so its patch appends tolerations; it lets the scheduler place this very pod now.
- Its controller's pod template (Deployment, StatefulSet, DaemonSet, ReplicaSet): the same tolerations plus any
  ``nodeSelector`` change, so the next pods are right too. A Job's template is immutable: it is re-created from the
  corrected YAML (``kubectl replace --force``), and this project's templates take the same values.
- The admission defaults (``node.kubernetes.io/not-ready`` and ``unreachable``, ``NoExecute``, 300 s) are not the
  user's tolerations: they are left out of the corrected YAML. No patch ever adds a node-health toleration.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from remediation.k8s.objects import Pod, Taint, Toleration
from remediation.k8s.scheduling import health_label

__all__ = ["PodFix", "apply_patch", "build_fix", "toleration_for", "user_tolerations"]

_CONTROLLERS = {
    "Deployment": "deployment",
    "StatefulSet": "statefulset",
    "DaemonSet": "daemonset",
    "ReplicaSet": "replicaset",
    "Job": "job",
}


def toleration_for(taint: Taint) -> Toleration:
    """The narrowest toleration of ``taint``: ``Equal`` on its key and value (``Exists`` for an empty value)."""
    if health_label(taint.key):
        raise ValueError(f"refusing to tolerate node-health taint {taint.text()}: fix the node instead")
    if taint.value:
        return Toleration(taint.key, "Equal", taint.value, taint.effect)
    return Toleration(taint.key, "Exists", "", taint.effect)


def _admission_default(t: Toleration) -> bool:
    return (
        t.key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        and t.operator == "Exists"
        and t.effect == "NoExecute"
        and t.toleration_seconds == 300
    )


def user_tolerations(pod: Pod) -> tuple[Toleration, ...]:
    """The pod's tolerations less the ones admission added by default."""
    return tuple(t for t in pod.tolerations if not _admission_default(t))


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _controller(pod: Pod) -> tuple[str, str] | None:
    """(kubectl resource, name) of the controller whose template makes this pod."""
    if not pod.owner_kind:
        return None
    if pod.owner_kind == "ReplicaSet":
        template_hash = pod.labels.get("pod-template-hash", "")
        if template_hash and pod.owner_name.endswith("-" + template_hash):
            return "deployment", pod.owner_name[: -len(template_hash) - 1]
    resource = _CONTROLLERS.get(pod.owner_kind)
    return (resource, pod.owner_name) if resource else None


def _ops(
    prefix: str, existing: Sequence[Any], has_selector: bool, add: Sequence[Toleration], selector: Mapping[str, str]
) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    if add:
        if existing:
            ops.extend({"op": "add", "path": f"{prefix}/tolerations/-", "value": t.to_dict()} for t in add)
        else:
            ops.append({"op": "add", "path": f"{prefix}/tolerations", "value": [t.to_dict() for t in add]})
    if selector:
        if has_selector:
            ops.extend(
                {"op": "add", "path": f"{prefix}/nodeSelector/{_pointer(k)}", "value": v} for k, v in selector.items()
            )
        else:
            ops.append({"op": "add", "path": f"{prefix}/nodeSelector", "value": dict(selector)})
    return ops


@dataclass(frozen=True)
class PodFix:
    """What to change in the pod spec, and how to send it."""

    tolerations: tuple[Toleration, ...]  # to add
    node_selector: dict[str, str]  # keys to set
    pod_ops: tuple[dict[str, Any], ...]  # JSON patch of the pod (tolerations only); () when the pod cannot take it
    template_ops: tuple[dict[str, Any], ...]  # JSON patch of the controller's pod template
    commands: tuple[str, ...]
    yaml: str  # the corrected spec fragment
    values: str  # the same, as values of templates/k8s (training-job, inference)

    @property
    def spec_ops(self) -> tuple[dict[str, Any], ...]:
        """The whole fix as a patch of a pod's own spec (for checking it with the evaluator)."""
        raw_prefix = "/spec/template/spec"
        return tuple({**op, "path": "/spec" + op["path"][len(raw_prefix) :]} for op in self.template_ops)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tolerations": [t.to_dict() for t in self.tolerations],
            "node_selector": dict(self.node_selector),
            "pod_patch": list(self.pod_ops),
            "template_patch": list(self.template_ops),
            "commands": list(self.commands),
            "yaml": self.yaml,
            "values": self.values,
        }


def build_fix(pod: Pod, tolerations: Sequence[Toleration], selector: Mapping[str, str]) -> PodFix:
    """The patches, commands and corrected YAML that add ``tolerations`` and set ``selector`` on ``pod``."""
    spec = pod.raw.get("spec", {}) if isinstance(pod.raw.get("spec"), Mapping) else {}
    listed = spec.get("tolerations")
    raw_tolerations: list[Any] = listed if isinstance(listed, list) else []
    has_selector = isinstance(spec.get("nodeSelector"), Mapping) and bool(spec.get("nodeSelector"))
    users = user_tolerations(pod)
    pod_ops = _ops("/spec", raw_tolerations, has_selector, tolerations, {}) if not selector else []
    template_ops = _ops("/spec/template/spec", users, has_selector, tolerations, selector)
    ns = shlex.quote(pod.namespace)
    commands: list[str] = []
    if pod_ops:
        commands.append(
            f"kubectl patch pod {shlex.quote(pod.name)} -n {ns} --type=json -p {shlex.quote(json.dumps(pod_ops))}"
        )
    controller = _controller(pod)
    if controller is not None and controller[0] != "job":
        resource, name = controller
        commands.append(
            f"kubectl patch {resource} {shlex.quote(name)} -n {ns} --type=json "
            f"-p {shlex.quote(json.dumps(template_ops))}"
        )
    elif controller is not None:
        commands.append(
            f"# job {controller[1]}: a Job's pod template is immutable; put the corrected YAML below into its "
            f"manifest and re-create it: kubectl replace --force -n {pod.namespace} -f JOB.yaml"
        )
    elif selector:
        commands.append(
            f"# pod {pod.name}: nodeSelector cannot change on a pod; re-create it from the corrected YAML below"
        )
    merged = [*(t.to_dict() for t in users), *(t.to_dict() for t in tolerations)]
    fragment: dict[str, Any] = {"tolerations": merged}
    new_selector = {**pod.node_selector, **selector}
    if new_selector:
        fragment["nodeSelector"] = new_selector
    corrected = yaml.safe_dump({"spec": fragment}, sort_keys=False, default_flow_style=False)
    values_doc: dict[str, Any] = {"tolerations": merged}
    if selector:
        values_doc["nodeSelector"] = new_selector
    values = yaml.safe_dump(values_doc, sort_keys=False, default_flow_style=False)
    return PodFix(
        tuple(tolerations), dict(selector), tuple(pod_ops), tuple(template_ops), tuple(commands), corrected, values
    )


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(doc: Mapping[str, Any], ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``doc`` with the JSON patch ``ops`` applied (``add`` and ``replace``; enough for the fixes built here)."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    for op in ops:
        if op.get("op") not in ("add", "replace"):
            raise ValueError(f"unsupported JSON patch op {op.get('op')!r}")
        tokens = [_unescape(t) for t in str(op["path"]).split("/")[1:]]
        target: Any = out
        for token in tokens[:-1]:
            target = target[int(token)] if isinstance(target, list) else target.setdefault(token, {})
        last = tokens[-1]
        value = copy.deepcopy(op.get("value"))
        if isinstance(target, list):
            if last == "-":
                target.append(value)
            else:
                target.insert(int(last), value) if op["op"] == "add" else target.__setitem__(int(last), value)
        else:
            target[last] = value
    return out
