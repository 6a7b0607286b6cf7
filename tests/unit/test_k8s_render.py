"""Templates: example values render and pass the Kubernetes schema; values validated; no value injects a field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.services import k8s_scenarios as scenarios
from remediation.core.errors import TemplateError
from remediation.k8s.errors import ValuesError
from remediation.k8s.evaluator import evaluate
from remediation.k8s.objects import node_from_dict, pod_from_dict
from remediation.k8s.render import (
    TEMPLATES,
    apply_sets,
    load_values,
    render,
    template_names,
    templates_dir,
    validate_manifest,
)

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("training-job", "inference", "audit-cronjob")


def _example(name: str) -> dict[str, Any]:
    return load_values(TEMPLATES / "examples" / f"{name}.yaml")


def test_templates_are_package_data_and_the_documented_path_links_there(tmp_path: Path) -> None:
    assert TEMPLATES == ROOT / "remediation" / "templates" / "k8s"
    link = ROOT / "templates"
    assert link.is_symlink() and link.readlink() == Path("remediation/templates")
    assert (link / "k8s").resolve() == TEMPLATES.resolve()
    # k8s.templates_dir: empty is the package's; a path of your own (relative: under the project directory) wins
    assert templates_dir("", tmp_path) == TEMPLATES
    assert templates_dir("mine/k8s", tmp_path) == tmp_path / "mine" / "k8s"
    assert templates_dir("/srv/k8s", tmp_path) == Path("/srv/k8s")


def test_one_example_per_template() -> None:
    assert template_names(TEMPLATES) == sorted(NAMES)
    assert sorted(p.stem for p in (TEMPLATES / "examples").glob("*.yaml")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("version", ["1.25", "1.30", "1.35"])
def test_examples_pass_the_kubernetes_schema(name: str, version: str) -> None:
    result = render(name, _example(name), TEMPLATES, version)
    assert result.documents
    for doc in result.documents:
        assert validate_manifest(doc, version) == version
    assert list(yaml.safe_load_all(result.yaml)) == list(result.documents)


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return doc["spec"]["template"]["spec"]


@pytest.mark.parametrize("name", ["training-job", "inference"])
def test_gpu_templates_carry_toleration_limits_and_pool_selector(name: str) -> None:
    doc = render(name, _example(name), TEMPLATES, "1.30").documents[0]
    spec = _pod_spec(doc)
    assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in spec["tolerations"]
    assert "kubernetes.azure.com/agentpool" in spec["nodeSelector"]
    server = spec["containers"][0]
    assert server["resources"]["limits"]["nvidia.com/gpu"] >= 1


def test_default_toleration_when_values_do_not_name_one() -> None:
    values = {"name": "t", "image": "img:1"}
    spec = _pod_spec(render("training-job", values, TEMPLATES, "1.30").documents[0])
    assert spec["tolerations"] == [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]


def test_training_job_schedules_onto_the_tainted_gpu_node() -> None:
    """Done when: the example Job's pod lands on a node tainted sku=gpu:NoSchedule in the evaluator."""
    job = render("training-job", _example("training-job"), TEMPLATES, "1.30").documents[0]
    template = job["spec"]["template"]
    pod = pod_from_dict({"kind": "Pod", "metadata": {**template["metadata"], "name": "x", "namespace": "ml-team"},
                         "spec": template["spec"]})
    nodes = [node_from_dict(n) for n in scenarios.runbook_cluster()["nodes"]]
    placed = [r.node for r in evaluate(pod, nodes) if r.fits]
    assert placed and all(any(t.key == "sku" and t.value == "gpu" for t in n.taints) for n in placed)


def test_inference_cold_start_and_placement() -> None:
    docs = render("inference", _example("inference"), TEMPLATES, "1.30").documents
    deployment, service = docs
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    spec = _pod_spec(deployment)
    init = spec["initContainers"][0]
    assert "azcopy copy" in init["command"][2]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env["MODEL_SOURCE"].startswith("https://") and env["MODEL_DIR"] == "/models/llama-3-8b-instruct"
    assert spec["volumes"][0]["hostPath"]["path"] == "/mnt/nvme/models"
    server = spec["containers"][0]
    assert server["readinessProbe"]["httpGet"]["path"] == "/health"
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 900
    assert {"key": "workload", "operator": "Equal", "value": "inference", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["nodeSelector"]["workload"] == "inference"
    assert server["resources"]["requests"] == server["resources"]["limits"]  # Guaranteed QoS


def test_cronjob_runs_the_audit() -> None:
    doc = render("audit-cronjob", _example("audit-cronjob"), TEMPLATES, "1.30").documents[0]
    command = _pod_spec(doc)["containers"][0]["command"]
    assert command[:4] == ["invoke", "audit", "--fleet", "gpu"] and "--history" in command
    assert doc["spec"]["concurrencyPolicy"] == "Forbid"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["gpu.count=0"], r"gpu\.count: 0 is less than the minimum of 1"),
        (["name=Bad_Name"], r"name: 'Bad_Name' does not match"),
        (["gpus=2"], r"Additional properties are not allowed \('gpus' was unexpected\)"),
        (["tolerations=[]"], r"tolerations: \[\] should be non-empty"),
        (["tolerations[0].key=node.kubernetes.io/unreachable"], r"node-health taint key: never tolerate it"),
    ],
)
def test_bad_values_one_clear_line(sets: list[str], message: str) -> None:
    with pytest.raises(ValuesError, match=message) as info:
        render("training-job", apply_sets(_example("training-job"), sets), TEMPLATES, "1.30", source="v.yaml")
    assert "\n" not in str(info.value) and "v.yaml" in str(info.value)


def test_cache_needs_an_image() -> None:
    values = _example("inference")
    del values["model"]["cache"]["image"]
    with pytest.raises(ValuesError, match="'image' is a required property"):
        render("inference", values, TEMPLATES, "1.30")


def test_set_paths() -> None:
    values = apply_sets({"a": {"b": 1}, "l": [{"k": "v"}]}, ["a.b=2", "a.c=x:y", "l[0].k=w", r"n.kubernetes\.io/x=1"])
    assert values == {"a": {"b": 2, "c": "x:y"}, "l": [{"k": "w"}], "n": {"kubernetes.io/x": 1}}
    with pytest.raises(ValuesError, match=r"key\.path=value"):
        apply_sets({}, ["novalue"])


def test_unknown_version_and_template() -> None:
    with pytest.raises(TemplateError, match="no bundled schema"):
        render("training-job", _example("training-job"), TEMPLATES, "1.9")
    with pytest.raises(TemplateError, match="no template 'nope'"):
        render("nope", {}, TEMPLATES, "1.30")


def test_a_template_that_skips_tojson_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml.j2").write_text("kind: Pod\nmetadata: {name: {{ name }}}\n")
    (tmp_path / "bad.schema.yaml").write_text("type: object\n")
    with pytest.raises(TemplateError, match="did not pass through tojson"):
        render("bad", {"name": "x"}, tmp_path, "1.30", validate=False)


EVIL = 'a\nkind: Secret\n  x: "y" \'z\' {{ name }} {% if 1 %}} ]: - #\u2028\x85 \U0001F600'


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


@pytest.mark.parametrize(
    ("name", "sets"),
    [
        ("training-job", {"args": [EVIL], "env": {"EVIL": EVIL}, "annotations": {"note": EVIL}}),
        ("inference", {"args": [EVIL], "env": {"EVIL": EVIL}, "annotations": {"note": EVIL},
                       "model": {"name": "m", "source": EVIL, "cache": {"image": "img:1"}}}),
        ("audit-cronjob", {"env": {"EVIL": EVIL}, "timeZone": EVIL}),
    ],
)
def test_no_value_injects_a_field(name: str, sets: dict[str, Any]) -> None:
    values = {**_example(name), **sets}
    clean = render(name, _example(name), TEMPLATES, "1.30", validate=False).documents
    evil = render(name, values, TEMPLATES, "1.30", validate=name != "audit-cronjob").documents
    # the same objects, the same keys: the value landed as one string, nothing else changed shape
    assert [d["kind"] for d in evil] == [d["kind"] for d in clean]
    assert (sorted(evil[0]) == sorted(clean[0]) and sorted(evil[0]["spec"]) == sorted(clean[0]["spec"])) or (
        name == "audit-cronjob" and set(evil[0]["spec"]) - set(clean[0]["spec"]) == {"timeZone"})
    assert EVIL in _strings(evil[0])
    assert "Secret" not in [d["kind"] for d in evil]
    reparsed = list(yaml.safe_load_all(render(name, values, TEMPLATES, "1.30", validate=False).yaml))
    assert EVIL in _strings(reparsed[0])
