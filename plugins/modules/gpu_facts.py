#!/usr/bin/python
# Apache-2.0 (see the project's pyproject.toml)
"""Ansible module: the GPU host probe's facts document as ``ansible_facts.gpufleet``.

The probe is the package ``plugins/module_utils/gpuprobe`` of the collection, a symbolic link to
``remediation/hostside/gpuprobe/``: one implementation for the SSH probe, the timer and this module (ansible-galaxy
keeps a link inside the collection as a link, so the installed collection has the same single package; AnsiballZ
packs each of its modules, which import each other relatively).  It runs on the target: keep it Python 3.8
compatible, standard library only.
"""

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Collect GPU host facts (NVML, kernels, NVIDIA modules, unattended-upgrades, apt history)
version_added: "0.1.0"
description:
  - Runs the gpufleet host probe on the target and returns its facts document (schema C(gpufleet.facts/1),
    see docs/facts-schema.md) as the fact C(gpufleet).
  - NVML is queried in a forked child that is killed after O(nvml_timeout) seconds, so a hung driver cannot
    hang the play. NVML failures are data (C(gpufleet.nvml.ok) false and C(gpufleet.nvml.error_class)), not a
    module failure.
  - The module only reads; it never changes the host. The NVML section needs the C(pynvml) Python module (PyPI
    C(nvidia-ml-py)). Where the target has none (a stock Azure Ubuntu image has none), the module's action plugin
    sends the controller's C(pynvml.py) (from the Python that runs Ansible) with the module's arguments, and the
    module loads it from memory; nothing is written on the target. Without either, that section reports
    C(error_class=other).
options:
  nvml_timeout:
    description:
      - Seconds before the NVML child process is killed and NVML is reported as C(timeout).
    type: float
    default: 10
  simulate_upgrades:
    description:
      - Also run C(unattended-upgrade --dry-run -d) and report what it would upgrade, skip as blacklisted or
        keep back as held (slow; up to 180 s).
    type: bool
    default: false
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Read-only; it collects the same facts in check mode.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
    support: full
requirements:
  - Python >= 3.8 on the target
  - pynvml (nvidia-ml-py) on the target or in the Python that runs Ansible, for the NVML section
notes:
  - The probe is the collection's module_utils package C(gpuprobe), the same package the SSH audit and the
    C(gpufleet.remediation.gpu_probe_timer) role run.
  - Run it as root for the dpkg lock test; other sections work without.
author:
  - gpu-fleet-remediation maintainers !UNKNOWN
"""

EXAMPLES = r"""
- name: Collect GPU facts
  gpufleet.remediation.gpu_facts:

- name: Collect GPU facts with a short NVML timeout and the unattended-upgrade dry run
  gpufleet.remediation.gpu_facts:
    nvml_timeout: 5
    simulate_upgrades: true

- name: Fail on hosts whose NVIDIA driver does not answer
  ansible.builtin.assert:
    that: ansible_facts.gpufleet.nvml.ok
    fail_msg: "NVML: {{ ansible_facts.gpufleet.nvml.error_class }}: {{ ansible_facts.gpufleet.nvml.error }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: complex
  contains:
    gpufleet:
      description:
        - The probe's facts document (schema C(gpufleet.facts/1)); sections C(system), C(nvml), C(packages),
          C(unattended_upgrades), C(apt_history), C(kernel_log), C(dkms_status), C(dpkg_lock), C(errors).
      returned: always
      type: dict
      sample:
        schema: gpufleet.facts/1
        probe_version: 1.0.0
        hostname: gpu-1
        system:
          kernel: 6.5.0-44-generic
          reboot_required: false
        nvml:
          ok: true
          error_class: none
          driver_version: 535.183.01
          device_count: 2
        errors: []
"""

# Ansible's module layout: imports follow the documentation blocks.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.gpufleet.remediation.plugins.module_utils.gpuprobe import (  # noqa: E402
    SCHEMA,
    collect,
    serve_pynvml,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvml_timeout=dict(type="float", default=10.0),
            simulate_upgrades=dict(type="bool", default=False),
            # Set by the action plugin: the controller's pynvml.py, packed, for a target without its own.
            _pynvml=dict(type="str", default=None, no_log=True),
        ),
        supports_check_mode=True,
    )
    if module.params["nvml_timeout"] <= 0:
        module.fail_json(msg=f"nvml_timeout must be a positive number of seconds, got {module.params['nvml_timeout']}")
    try:
        serve_pynvml(module.params["_pynvml"])
        doc = collect(
            {"nvml_timeout": module.params["nvml_timeout"], "simulate_upgrades": module.params["simulate_upgrades"]}
        )
    except Exception as exc:  # collect() turns section failures into data; this is a bug in the probe itself
        module.fail_json(msg=f"gpu probe failed: {type(exc).__name__}: {exc}", schema=SCHEMA)
    module.exit_json(changed=False, ansible_facts={"gpufleet": doc})


if __name__ == "__main__":
    main()
