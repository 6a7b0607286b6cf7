"""Invoke entry point of the checkout: the project's namespace (:mod:`commands.namespace`), one collection per area.

Each area's tasks are thin shells over the ``remediation`` library (and the ``lab``) in ``commands/<area>.py``;
``commands/namespace.py`` assembles them and registers the defaults of every typed config section. The installed
``gpufleet`` console script runs the same namespace from any directory. ``invoke --list`` shows every task.
"""

from __future__ import annotations

from pathlib import Path

from commands import preflight

# Invoke loads the invoke.yaml beside this file right after importing it: a broken one is one line and exit 2 here,
# not Invoke's traceback later
preflight(Path(__file__).resolve().with_name("invoke.yaml"))

from commands.namespace import ns  # noqa: E402 - after the preflight: the config file is checked first

__all__ = ["ns"]
