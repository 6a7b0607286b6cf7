"""Azure REST specs (Swagger 2.0, from Azure/azure-rest-api-specs) as the local ARM service's rule book.

:class:`SpecSet` loads the spec files under ``lab/services/azure-specs`` (see its SOURCES.md), finds an operation by
file, path template and method, and validates a JSON document against a schema of it: ``$ref`` (local and across
files), ``allOf``, polymorphism by ``discriminator`` / ``x-ms-discriminator-value``, types, ``format`` int32/int64
ranges, ``enum`` (except where ``x-ms-enum`` says ``modelAsString``: those are extensible), ``required``,
``minimum``/``maximum``, ``minLength``, ``pattern``, ``additionalProperties``.
Request bodies are checked strictly: a property the schema does not define, or one marked ``readOnly``, is an error
(ARM would ignore it; a client that sends one does not know the API). Responses are checked for types, enums and
required properties.

``managedClusters.json`` (AKS) carries one stray trailing comma upstream; files are read leniently (trailing commas
before ``}``/``]`` dropped) as SOURCES.md advises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["SpecSet", "load_lenient"]

_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
_INT_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def load_lenient(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(_TRAILING_COMMA.sub(r"\1", text))


class SpecSet:
    """The spec files under ``root``, loaded on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._docs: dict[Path, Any] = {}

    def doc(self, path: Path) -> Any:
        path = path.resolve()
        if path not in self._docs:
            self._docs[path] = load_lenient(path)
        return self._docs[path]

    def file(self, relative: str) -> Path:
        path = (self.root / relative).resolve()
        if not path.exists():
            raise FileNotFoundError(f"spec file {relative} not found under {self.root} (see its SOURCES.md)")
        return path

    def api_version(self, relative: str) -> str:
        return str(self.doc(self.file(relative))["info"]["version"])

    def operation(self, relative: str, template: str, method: str) -> tuple[dict[str, Any], Path]:
        path = self.file(relative)
        op = self.doc(path)["paths"][template][method.lower()]
        return op, path

    def example(self, relative: str) -> Any:
        return self.doc(self.file(relative))

    def definition(self, relative: str, name: str) -> tuple[dict[str, Any], Path]:
        path = self.file(relative)
        return self.doc(path)["definitions"][name], path

    def resolve(self, schema: Mapping[str, Any], base: Path) -> tuple[Mapping[str, Any], Path]:
        seen = 0
        while "$ref" in schema:
            seen += 1
            if seen > 20:
                raise ValueError(f"$ref loop at {schema['$ref']}")
            ref = str(schema["$ref"])
            file_part, _, pointer = ref.partition("#")
            target = (base.parent / file_part).resolve() if file_part else base
            node: Any = self.doc(target)
            for part in [p for p in pointer.split("/") if p]:
                node = node[part.replace("~1", "/").replace("~0", "~")]
            schema, base = node, target
        return schema, base

    # -- the parameters of an operation ------------------------------------------------------------------------
    def parameters(self, relative: str, template: str, method: str) -> list[tuple[Mapping[str, Any], Path]]:
        path = self.file(relative)
        doc = self.doc(path)
        raw = list(doc["paths"][template].get("parameters", [])) + list(
            doc["paths"][template][method.lower()].get("parameters", [])
        )
        return [self.resolve(p, path) for p in raw]

    def body_schema(self, relative: str, template: str, method: str) -> tuple[Mapping[str, Any], Path] | None:
        for p, base in self.parameters(relative, template, method):
            if p.get("in") == "body":
                return p["schema"], base
        return None

    def response_schema(
        self, relative: str, template: str, method: str, status: int
    ) -> tuple[Mapping[str, Any], Path] | None:
        op, path = self.operation(relative, template, method)
        resp = op.get("responses", {}).get(str(status)) or op.get("responses", {}).get("default")
        if not resp or "schema" not in resp:
            return None
        return resp["schema"], path

    # -- validation --------------------------------------------------------------------------------------------
    def validate(self, value: Any, schema: Mapping[str, Any], base: Path, *, request: bool, where: str = "body"
                 ) -> list[str]:
        """Every way ``value`` breaks ``schema`` (empty when it conforms)."""
        errors: list[str] = []
        self._check(value, schema, base, request, where, errors)
        return errors

    def _subtype(self, schema: Mapping[str, Any], base: Path, value: Mapping[str, Any]) -> tuple[Mapping[str, Any],
                                                                                                 Path] | None:
        disc = schema.get("discriminator")
        if not disc or disc not in value:
            return None
        wanted = value[disc]
        doc = self.doc(base)
        for name, definition in (doc.get("definitions") or {}).items():
            tag = definition.get("x-ms-discriminator-value", name)
            if tag != wanted:
                continue
            for part in definition.get("allOf") or []:
                target, _ = self.resolve(part, base)
                if target is schema:
                    return definition, base
        return None

    def _flatten(self, schema: Mapping[str, Any], base: Path) -> tuple[dict[str, tuple[Mapping[str, Any], Path]],
                                                                       set[str], Any, bool]:
        """Properties, required names, additionalProperties and "is an object schema" over ``allOf``."""
        props: dict[str, tuple[Mapping[str, Any], Path]] = {}
        required: set[str] = set(schema.get("required") or [])
        additional = schema.get("additionalProperties")
        is_object = schema.get("type") == "object" or "properties" in schema
        for part in schema.get("allOf") or []:
            sub, sub_base = self.resolve(part, base)
            p, r, a, o = self._flatten(sub, sub_base)
            props.update(p)
            required |= r
            additional = additional if additional is not None else a
            is_object = is_object or o
        for name, prop in (schema.get("properties") or {}).items():
            props[name] = (prop, base)
        return props, required, additional, is_object

    def _check(self, value: Any, schema: Mapping[str, Any], base: Path, request: bool, where: str,
               errors: list[str]) -> None:
        schema, base = self.resolve(schema, base)
        if isinstance(value, Mapping):
            sub = self._subtype(schema, base, value)
            if sub is not None:
                schema, base = sub
        kind = schema.get("type")
        if kind is None and ("properties" in schema or "allOf" in schema):
            kind = "object"
        if value is None:
            if schema.get("x-nullable") is True:
                return
            errors.append(f"{where}: null where the spec wants {kind or 'a value'}")
            return
        if kind == "object":
            if not isinstance(value, Mapping):
                errors.append(f"{where}: expected an object, got {type(value).__name__}")
                return
            props, required, additional, _ = self._flatten(schema, base)
            for name in sorted(required):
                if name not in value:
                    errors.append(f"{where}: required property {name!r} is missing")
            for name, item in value.items():
                if name in props:
                    prop, prop_base = props[name]
                    resolved, _ = self.resolve(prop, prop_base)
                    if request and (prop.get("readOnly") or resolved.get("readOnly")):
                        errors.append(f"{where}.{name}: read-only in the spec, must not be sent")
                        continue
                    self._check(item, prop, prop_base, request, f"{where}.{name}", errors)
                elif isinstance(additional, Mapping):
                    self._check(item, additional, base, request, f"{where}.{name}", errors)
                elif props and additional is not True and request:
                    known = ", ".join(sorted(props))
                    errors.append(f"{where}.{name}: not a property the spec defines (known: {known})")
            return
        if kind == "array":
            if not isinstance(value, list):
                errors.append(f"{where}: expected an array, got {type(value).__name__}")
                return
            for i, item in enumerate(value):
                self._check(item, schema.get("items") or {}, base, request, f"{where}[{i}]", errors)
            return
        if kind == "string":
            if not isinstance(value, str):
                errors.append(f"{where}: expected a string, got {value!r}")
                return
            if "minLength" in schema and len(value) < int(schema["minLength"]):
                errors.append(f"{where}: shorter than {schema['minLength']}")
            if "pattern" in schema and not re.search(str(schema["pattern"]), value):
                errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
        elif kind == "integer":
            if not isinstance(value, int) or isinstance(value, bool):
                errors.append(f"{where}: expected an integer, got {value!r}")
                return
            low, high = _INT_RANGE.get(str(schema.get("format")), (None, None))
            if low is not None and high is not None and not low <= value <= high:
                errors.append(f"{where}: {value} is out of {schema.get('format')} range")
        elif kind == "number":
            if not isinstance(value, int | float) or isinstance(value, bool):
                errors.append(f"{where}: expected a number, got {value!r}")
                return
        elif kind == "boolean" and not isinstance(value, bool):
            errors.append(f"{where}: expected true or false, got {value!r}")
            return
        extensible = bool((schema.get("x-ms-enum") or {}).get("modelAsString"))  # ARM: new values may appear
        if "enum" in schema and not extensible and value not in schema["enum"]:
            errors.append(f"{where}: {value!r} is not one of {schema['enum']}")
        if isinstance(value, int | float) and not isinstance(value, bool):
            if "minimum" in schema and value < schema["minimum"]:
                errors.append(f"{where}: {value} is below the minimum {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                errors.append(f"{where}: {value} is above the maximum {schema['maximum']}")
