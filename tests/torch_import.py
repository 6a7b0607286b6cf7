"""torch (with transformers and peft) for the planner's exactness tests, in a process that also ran Ansible.

ansible-core replaces ``sys.intern`` with a callable object (``SysInternPatch``) when it is imported; torch._dynamo,
imported with torch or later by transformers and peft, registers a polyfill for ``sys.intern`` and refuses anything
but the builtin function. The whole suite imports Ansible first (the lab tests), so torch and everything that pulls
in ``torch._dynamo`` are imported here with the builtin back in place for the duration of the import.
"""

from __future__ import annotations

import sys
from functools import cache
from types import ModuleType


@cache
def torch() -> ModuleType:
    patched = sys.intern
    original = getattr(patched, "unpatched_implementation", patched)
    sys.intern = original
    try:
        # transformers and peft import torch._dynamo lazily: import everything now, under the builtin
        import peft  # noqa: F401
        import torch as module
        import torch._dynamo
        import transformers  # noqa: F401
    finally:
        sys.intern = patched
    return module
