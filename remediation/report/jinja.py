"""The one Jinja2 environment factory (:func:`strict_environment`: ``StrictUndefined``, no autoescape), and the
report formats' environment built with it.

:func:`strict_environment` is what every Python-side template goes through: the report formats here and the
Kubernetes manifests of ``templates/k8s/`` (:mod:`remediation.k8s.render`, which adds a ``finalize`` that refuses
any value not serialised by its ``tojson``).

Templates live in ``remediation/report/templates/``. Values from the field reach a template only through the
Markdown filters of :mod:`remediation.report.markdown` (``fence``, ``code``, ``md``), so a template decides the
document's structure and evidence cannot. A missing variable or a template error raises
:class:`~remediation.core.errors.TemplateError` naming the template.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from remediation.core.errors import TemplateError
from remediation.core.resources import package_dir
from remediation.report import markdown

__all__ = ["TEMPLATES", "environment", "render_template", "strict_environment"]

TEMPLATES = package_dir("report", "templates")


def strict_environment(
    directory: Path,
    filters: Mapping[str, Callable[..., Any]] | None = None,
    finalize: Callable[[Any], Any] | None = None,
) -> jinja2.Environment:
    """An environment over ``directory``: a missing variable is an error, nothing is escaped implicitly (the
    callers' filters serialise or escape every value for their format), ``filters`` added."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - not HTML: Markdown or YAML, escaped/serialised by the callers' filters
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=finalize,
    )
    env.filters.update(filters or {})
    return env


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The report formats' environment (cached: templates are compiled once per process)."""
    env = strict_environment(TEMPLATES)
    env.filters["fence"] = markdown.fence
    env.filters["code"] = markdown.code
    env.filters["md"] = markdown.inline
    return env


def render_template(name: str, **context: Any) -> str:
    """Render template ``name`` with ``context``; :class:`TemplateError` on any template problem."""
    try:
        return environment().get_template(name).render(**context)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"template {name}: {exc}") from exc
