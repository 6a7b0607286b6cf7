"""An area's entry module (``remediation/<area>/api.py``) names what the tasks call and loads each name from its
module on first use (PEP 562), so a task imports only what it runs and ``invoke --list`` stays instant."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any


class LazyExports:
    """``exports``: name -> the module that defines it; ``modules``: name -> a module exported whole."""

    def __init__(self, module: str, exports: Mapping[str, str], modules: Mapping[str, str] | None = None) -> None:
        self.module = module
        self.exports = dict(exports)
        self.modules = dict(modules or {})

    @property
    def names(self) -> list[str]:
        return sorted([*self.exports, *self.modules])

    def load(self, name: str) -> Any:
        """The value of ``name``, imported now and kept on the entry module (raises AttributeError when unknown)."""
        if name in self.modules:
            value = importlib.import_module(self.modules[name])
        elif name in self.exports:
            value = getattr(importlib.import_module(self.exports[name]), name)
        else:
            raise AttributeError(f"module {self.module!r} has no attribute {name!r}")
        setattr(sys.modules[self.module], name, value)
        return value
