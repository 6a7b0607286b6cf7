#!/usr/bin/python
# Apache-2.0 (see the project's pyproject.toml)
"""Ansible module: where the NVIDIA kernel module of one kernel is, and its version (read-only).

Finds the module exactly as the probe does (``gpuprobe.find_nvidia_module``: DKMS's
``updates/dkms``, the kernel's own tree, then a bounded walk; ``.ko``, ``.ko.xz``, ``.ko.zst``, ``.ko.gz``), so the
roles never judge a module by a path of their own. It runs on the target: Python 3.8, standard library only.
"""

DOCUMENTATION = r"""
---
module: nvidia_module
short_description: Find the NVIDIA kernel module of one kernel and read its version
version_added: "0.1.0"
description:
  - Looks under C(/lib/modules/KERNEL) the way the gpufleet probe does (DKMS location, the kernel tree, then a
    bounded walk) for C(nvidia.ko) in any compression the kernel loads (.ko, .ko.xz, .ko.zst, .ko.gz).
  - Reads the module's C(version) from its modinfo strings; .ko.xz/.ko.gz are decompressed with the standard
    library, .ko.zst with the host's C(zstd) program (else C(modinfo)), as the probe does.
  - Only reads; never changes the host.
options:
  kernel:
    description: The kernel release, as C(uname -r) prints it.
    type: str
    required: true
author:
  - gpu-fleet-remediation maintainers !UNKNOWN
"""

EXAMPLES = r"""
- name: Where is the NVIDIA module for the booted kernel?
  gpufleet.remediation.nvidia_module:
    kernel: "{{ ansible_kernel }}"
  register: module
"""

RETURN = r"""
present:
  description: Whether the kernel has an NVIDIA module.
  type: bool
  returned: always
path:
  description: The module file, or null.
  type: str
  returned: always
version:
  description: The driver version the module carries, or null when it cannot be read.
  type: str
  returned: always
source:
  description: C(dkms) (updates/dkms), C(package) (the kernel's own tree, a precompiled package), C(other), or null.
  type: str
  returned: always
signed:
  description: >-
    Whether the module file ends with the kernel's signature magic (null when unreadable, or a .ko.zst with
    neither zstd nor modinfo).
  type: bool
  returned: always
"""

# Ansible's module layout: imports follow the documentation blocks.
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.gpufleet.remediation.plugins.module_utils.gpuprobe import (  # noqa: E402
    find_nvidia_module,
    module_signed,
    module_source,
    module_version,
)


def main():
    module = AnsibleModule(argument_spec=dict(kernel=dict(type="str", required=True)), supports_check_mode=True)
    kernel = module.params["kernel"]
    if not kernel or "/" in kernel or kernel in (".", ".."):
        module.fail_json(msg=f"kernel {kernel!r} is not a kernel release (as `uname -r` prints it)")
    modules_dir = os.path.join("/lib/modules", kernel)
    path = find_nvidia_module(modules_dir)
    version = None
    signed = None
    if path is not None:
        try:
            version = module_version(path)
        except (OSError, EOFError, ValueError):
            version = None
        try:
            signed = module_signed(path)
        except (OSError, EOFError, ValueError):
            signed = None
    module.exit_json(changed=False, present=path is not None, path=path, version=version,
                     source=module_source(modules_dir, path), signed=signed)


if __name__ == "__main__":
    main()
