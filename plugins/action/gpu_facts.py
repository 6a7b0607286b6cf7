# Apache-2.0 (see the project's pyproject.toml)
"""Action plugin of the ``gpu_facts`` module: runs the module with the controller's ``pynvml.py`` beside its
arguments, for targets without their own.

A stock Azure Ubuntu image with the NVIDIA driver has no ``pynvml``; the SSH audit's bundle carries the
controller's copy for such hosts (:mod:`remediation.hostside`), and this plugin does the same for the module: the
text of the ``pynvml.py`` installed in the Python that runs Ansible, packed as the bundle packs it, goes in the
hidden argument ``_pynvml`` (``no_log``: it never shows in a result). The module uses it only when ``import
pynvml`` would fail on the target, from memory. Without the project's package or ``pynvml`` on the controller,
the module runs as it is and reports a target without ``pynvml`` as NVML ``error_class=other``.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase


def _packed_pynvml() -> str | None:
    try:
        from remediation.hostside import pynvml_packed
    except ImportError:
        return None
    return pynvml_packed()


class ActionModule(ActionBase):
    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = dict(self._task.args)
        args.pop("_pynvml", None)  # the plugin's to set, never a task's
        packed = _packed_pynvml()
        if packed is not None:
            args["_pynvml"] = packed
        result.update(
            self._execute_module(
                module_name="gpufleet.remediation.gpu_facts", module_args=args, task_vars=task_vars or {}
            )
        )
        return result
