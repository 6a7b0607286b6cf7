"""The one Jinja2 environment of the report formats: ``StrictUndefined``, no autoescape (Markdown, not HTML).

Templates live in ``remediation/report/templates/``. Values from the field reach a template only through the
Markdown filters of :mod:`remediation.report.markdown` (``fence``, ``code``, ``md``), so a template decides the
document's structure and evidence cannot. A missing variable or a template error raises
:class:`~remediation.errors.TemplateError` naming the template.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from remediation.errors import TemplateError
from remediation.report import markdown

__all__ = ["TEMPLATES", "environment", "render_template"]

TEMPLATES = Path(__file__).resolve().parent / "templates"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The shared environment (cached: templates are compiled once per process)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - the output is Markdown; the Markdown filters do the escaping
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
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
