#!/usr/bin/python
# Apache-2.0 (see the project's pyproject.toml)
"""Ansible module: wait until no apt or dpkg process holds the dpkg locks (read-only).

The lock check is the probe's own (``gpuprobe.lock_state``: a non-blocking POSIX write lock,
taken and dropped at once, as dpkg and apt take theirs). The driver restore's undo waits here first, so that a step
of a run that was cut short (a playbook killed by its timeout leaves apt running on the host) finishes before the
undo reads the host's state. Python 3.8, standard library only; runs on the target.
"""

DOCUMENTATION = r"""
---
module: dpkg_idle
short_description: Wait until the dpkg locks are free
version_added: "0.1.0"
description:
  - Polls C(/var/lib/dpkg/lock-frontend) and C(/var/lib/dpkg/lock) the way the gpufleet probe checks them, until
    neither is held or O(timeout) seconds have passed. Never takes a lock for longer than the check, never
    changes the host.
options:
  timeout:
    description: Seconds to wait before failing, naming the process that holds the lock.
    type: float
    default: 60
author:
  - gpu-fleet-remediation maintainers !UNKNOWN
"""

EXAMPLES = r"""
- name: Wait for a running apt to finish
  gpufleet.remediation.dpkg_idle:
    timeout: 120
"""

RETURN = r"""
waited:
  description: Seconds spent waiting.
  type: float
  returned: always
"""

# Ansible's module layout: imports follow the documentation blocks.
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.gpufleet.remediation.plugins.module_utils.gpuprobe import lock_state  # noqa: E402

LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")


def main():
    module = AnsibleModule(argument_spec=dict(timeout=dict(type="float", default=60.0)), supports_check_mode=True)
    timeout = module.params["timeout"]
    if timeout < 0:
        module.fail_json(msg=f"timeout must be 0 or more seconds, got {timeout}")
    start = time.monotonic()
    while True:
        held = [s for s in (lock_state(p) for p in LOCKS) if s["held"]]
        if not held:
            module.exit_json(changed=False, waited=round(time.monotonic() - start, 2))
        if time.monotonic() - start >= timeout:
            who = held[0]
            module.fail_json(
                msg=f"{who['path']} still held by {who['holder_comm'] or 'a process'} (pid {who['holder_pid'] or '?'})"
                f" after {timeout:.0f} s",
                waited=round(time.monotonic() - start, 2),
            )
        time.sleep(0.5)


if __name__ == "__main__":
    main()
