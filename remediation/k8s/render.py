"""Kubernetes manifests from the templates of ``templates/k8s/`` (package data, :data:`TEMPLATES`; ``k8s.templates_dir``
names a directory of your own instead): values checked, every value serialised, output
checked against the Kubernetes OpenAPI schema.

A template ``NAME.yaml.j2`` comes with ``NAME.schema.yaml`` (JSON Schema of its values, with their defaults) and an
example ``examples/NAME.yaml``. Rendering:

1. values from a YAML file, then ``--set key.path=value`` overrides (the value read as a YAML scalar, so
   ``--set gpu.count=2`` is a number; ``\\.`` keeps a dot inside a key);
2. defaults filled from the schema, then the values validated against it: the first error, one line, naming the
   key path and the rule (``gpu.count: 0 is less than the minimum of 1``);
3. the template rendered through the one strict environment (:func:`remediation.report.jinja.strict_environment`)
   whose ``finalize`` refuses any ``{{ ... }}`` output that did not pass through ``tojson``: every value reaches the
   YAML as a JSON scalar or object (JSON is YAML), so no value (newlines, colons, quotes, ``{{``) can add a field;
4. the output parsed back as YAML documents and each checked against the Kubernetes OpenAPI schema of the
   configured version, strictly (unknown fields are errors), with ``kubernetes-validate``'s bundled schemas (offline);
5. printed with a YAML dumper (block style; multi-line strings as literal blocks).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from remediation.core.errors import TemplateError
from remediation.core.resources import package_dir
from remediation.k8s.errors import ValuesError

__all__ = ["TEMPLATES", "Rendered", "apply_sets", "load_values", "render", "template_names", "templates_dir", "to_yaml",
           "validate_manifest"]

SUFFIX = ".yaml.j2"
#: The templates installed with the package (``remediation/templates/k8s``): the default of ``k8s.templates_dir``.
TEMPLATES = package_dir("templates", "k8s")


def templates_dir(setting: str | Path, base: Path) -> Path:
    """The templates directory ``k8s.templates_dir`` names (a relative one under ``base``, the project directory or
    the working directory), or the package's own when it is empty."""
    if not str(setting):
        return TEMPLATES
    return base / Path(setting).expanduser()


class Serialised(str):
    """Template output that went through ``tojson`` (the only kind the environment's ``finalize`` lets through)."""

    __slots__ = ()


# Characters JSON leaves raw that YAML reads differently (C1 controls incl. NEL, line/paragraph separators) or
# refuses (surrogates, U+FFFE/U+FFFF): escaped as \\uXXXX, which is both valid JSON and a YAML escape.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")


def tojson(value: Any) -> Serialised:
    """``value`` as one line of JSON that YAML reads back as the same value."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TemplateError(f"value {value!r} cannot be serialised: {exc}") from None
    return Serialised(_YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


def merge(*mappings: Any) -> dict[str, Any]:
    """The union of mappings, later keys winning (``labels | merge({...})``)."""
    out: dict[str, Any] = {}
    for m in mappings:
        if isinstance(m, Mapping):
            out.update(m)
    return out


def envlist(env: Any) -> list[dict[str, str]]:
    """``{NAME: value}`` as a container's ``env`` list."""
    if not isinstance(env, Mapping):
        return []
    return [{"name": str(k), "value": str(v)} for k, v in env.items()]


def _finalize(value: Any) -> Any:
    if isinstance(value, Serialised):
        return value
    raise TemplateError(
        f"template output {str(value)[:60]!r} did not pass through tojson: every value must be serialised"
    )


def template_names(directory: Path) -> list[str]:
    return sorted(p.name[: -len(SUFFIX)] for p in directory.glob(f"*{SUFFIX}"))


def _template_path(directory: Path, name: str) -> Path:
    path = directory / f"{name}{SUFFIX}"
    if not path.is_file():
        known = ", ".join(template_names(directory)) or "none"
        raise TemplateError(f"no template {name!r} in {directory} (templates: {known})")
    return path


def load_values(path: str | Path) -> dict[str, Any]:
    """A values file (YAML mapping); :class:`ValuesError` naming the file otherwise."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValuesError(f"--values {path}: cannot read it: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise ValuesError(f"--values {path}:{line} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValuesError(f"--values {path}: expected a mapping of values at the top, got {type(data).__name__}")
    return data


_SET = re.compile(r"^(?P<key>(?:[^=\\]|\\.)+)=(?P<value>.*)$", re.S)


def _set_path(key: str) -> list[str | int]:
    parts: list[str | int] = []
    for raw in re.split(r"(?<!\\)\.", key):
        token = raw.replace("\\.", ".")
        index = re.fullmatch(r"(.*)\[(\d+)\]", token)
        if index:
            if index.group(1):
                parts.append(index.group(1))
            parts.append(int(index.group(2)))
        else:
            parts.append(token)
    return parts


def apply_sets(values: Mapping[str, Any], sets: Sequence[str]) -> dict[str, Any]:
    """``values`` with each ``key.path=value`` applied (value read as a YAML scalar or flow collection)."""
    out: dict[str, Any] = copy.deepcopy(dict(values))
    for item in sets:
        match = _SET.match(item)
        if not match or not match.group("key").strip():
            raise ValuesError(f"--set {item!r}: expected key.path=value, e.g. --set gpu.count=2")
        try:
            value = yaml.safe_load(match.group("value")) if match.group("value").strip() else ""
        except yaml.YAMLError:
            value = match.group("value")
        path = _set_path(match.group("key").strip())
        target: Any = out
        for i, part in enumerate(path[:-1]):
            nxt = path[i + 1]
            if isinstance(part, int):
                if not isinstance(target, list) or part >= len(target):
                    raise ValuesError(f"--set {item!r}: index {part} is past the end of the list")
                target = target[part]
            else:
                if not isinstance(target, dict):
                    raise ValuesError(f"--set {item!r}: {part} is not inside a mapping")
                target = target.setdefault(part, [] if isinstance(nxt, int) else {})
        last = path[-1]
        if isinstance(last, int):
            if not isinstance(target, list):
                raise ValuesError(f"--set {item!r}: not a list")
            if last < len(target):
                target[last] = value
            elif last == len(target):
                target.append(value)
            else:
                raise ValuesError(f"--set {item!r}: index {last} is past the end of the list")
        elif isinstance(target, dict):
            target[last] = value
        else:
            raise ValuesError(f"--set {item!r}: {last} is not inside a mapping")
    return out


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """A subschema with its local ``$ref`` (``#/$defs/NAME``) merged in; the subschema's own keys win."""
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return schema
    target = root.get("$defs", {}).get(ref[len("#/$defs/") :], {})
    return {**_resolve(target, root), **{k: v for k, v in schema.items() if k != "$ref"}}


def _defaults(schema: Mapping[str, Any], value: Any, root: Mapping[str, Any] | None = None) -> Any:
    """``value`` with the schema's defaults filled in (objects only; lists are taken as given)."""
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if value is None and "default" in schema:
        value = copy.deepcopy(schema["default"])
    props = schema.get("properties")
    if isinstance(props, Mapping) and (value is None or isinstance(value, dict)):
        filled = dict(value or {})
        for key, sub in props.items():
            if not isinstance(sub, Mapping):
                continue
            sub = _resolve(sub, root)
            if key in filled:
                filled[key] = _defaults(sub, filled[key], root)
            elif "default" in sub or (sub.get("type") == "object" and isinstance(sub.get("properties"), Mapping)):
                result = _defaults(sub, None, root)
                if result is not None:
                    filled[key] = result
        return filled if filled or value is not None else None
    return value


def _schema(directory: Path, name: str) -> dict[str, Any]:
    path = directory / f"{name}.schema.yaml"
    try:
        schema = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TemplateError(f"template {name}: schema {path} unreadable: {exc.strerror}") from None
    if not isinstance(schema, dict):
        raise TemplateError(f"template {name}: {path} is not a JSON Schema object")
    return schema


def validate_values(directory: Path, name: str, values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Defaults filled, then checked against ``NAME.schema.yaml``; :class:`ValuesError` with the first problem."""
    import jsonschema

    schema = _schema(directory, name)
    filled = _defaults(schema, dict(values))
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(filled))
    if error is not None:
        path = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        message = error.message
        if error.validator == "not" and "key" in [str(p) for p in error.absolute_path]:
            message = f"{error.instance!r} is a node-health taint key: never tolerate it, fix the node"
        elif error.validator == "pattern":
            message = f"{error.instance!r} does not match {error.validator_value!r}"
        raise ValuesError(f"values {source}: {path}: {message} (schema: templates/k8s/{name}.schema.yaml)")
    assert isinstance(filled, dict)
    return filled


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str)
_Dumper.add_representer(Serialised, _str)


def to_yaml(docs: Sequence[Mapping[str, Any]]) -> str:
    """Documents as YAML (block style, keys in template order, multi-line strings as literal blocks)."""
    return yaml.dump_all(
        [dict(d) for d in docs],
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=False,  # non-ASCII escaped: PyYAML writes NEL (U+0085) raw and reads it back as a break
        width=120,
        explicit_start=len(docs) > 1,
    )


def validate_manifest(doc: Mapping[str, Any], version: str) -> str:
    """``doc`` checked against the Kubernetes OpenAPI schema of ``version`` (strict); the version used, or
    :class:`TemplateError` naming the object, the field and the rule."""
    import kubernetes_validate
    from kubernetes_validate import utils as kv_utils

    versions = sorted(
        {v.rsplit(".", 1)[0] for v in kv_utils.all_versions()}, key=lambda v: tuple(map(int, v.split(".")))
    )
    wanted = re.sub(r"^v", "", str(version)).strip()
    if not re.fullmatch(r"\d+\.\d+(?:\.\d+)?", wanted) or ".".join(wanted.split(".")[:2]) not in versions:
        raise TemplateError(
            f"Kubernetes version {version!r} has no bundled schema (k8s.kubernetes_version / --kube-version); "
            f"known: {', '.join(versions)}"
        )
    kind = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    try:
        return str(kubernetes_validate.validate(dict(doc), ".".join(wanted.split(".")[:2]), strict=True))
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path) or "(top level)"
        raise TemplateError(
            f"rendered {kind} fails the Kubernetes {exc.version} schema at {path}: {exc.message}"
        ) from None
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise TemplateError(f"rendered {kind}: {exc.message}") from None


@dataclass(frozen=True)
class Rendered:
    template: str
    values: dict[str, Any]
    documents: tuple[dict[str, Any], ...]
    kube_version: str

    @property
    def yaml(self) -> str:
        return to_yaml(self.documents)


def render(
    name: str,
    values: Mapping[str, Any],
    directory: Path,
    kube_version: str,
    source: str = "values",
    validate: bool = True,
) -> Rendered:
    """Render template ``name`` of ``directory`` with ``values`` (see the module docstring)."""
    import jinja2

    from remediation.report.jinja import strict_environment

    template_path = _template_path(directory, name)
    checked = validate_values(directory, name, values, source)
    env = strict_environment(directory, {"tojson": tojson, "merge": merge, "envlist": envlist}, _finalize)
    try:
        text = env.get_template(template_path.name).render(**checked)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"template {name}: {exc}") from None
    try:
        documents = tuple(d for d in yaml.safe_load_all(text) if d is not None)
    except yaml.YAMLError as exc:
        raise TemplateError(f"template {name} rendered invalid YAML: {exc}") from None
    for doc in documents:
        if not isinstance(doc, dict) or "kind" not in doc:
            raise TemplateError(f"template {name} rendered a document that is not a Kubernetes object")
        if validate:
            validate_manifest(doc, kube_version)
    return Rendered(name, checked, documents, kube_version)
