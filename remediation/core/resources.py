"""The package's own data files (templates), found with :mod:`importlib.resources`, never from a checkout's layout.

Wheels install unpacked, so each data directory is a directory on disk: Jinja2's loader and the values schemas
read it as one. A zipped install (zipimport) has no such directory and is refused with one line.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from remediation.core.errors import TemplateError

__all__ = ["package_dir"]


def package_dir(*parts: str) -> Path:
    """The directory ``remediation/<parts...>`` of the installed package (or of the source tree it runs from)."""
    resource = files("remediation").joinpath(*parts)
    if not isinstance(resource, Path):
        raise TemplateError(
            f"package data {'/'.join(parts)} is not a directory on disk ({type(resource).__name__}): "
            "install gpu-fleet-remediation unpacked (pip install), not as a zip"
        )
    return resource
