#!/usr/bin/python
# Apache-2.0 (see the project's pyproject.toml)
"""Ansible module: hold a set of installed packages with one ``dpkg --set-selections``.

``ansible.builtin.dpkg_selections`` takes one package per run, so a role that holds the booted kernel's packages, its
meta-packages and the driver's paid one module run per package, plus a ``package_facts`` run to learn which are
installed. This module reads dpkg's database once (``dpkg-query --show``), chooses the installed packages named or
matching a pattern, and sets the selection of those not already held in one ``dpkg --set-selections`` call.
Check mode and diff mode report what would change and change nothing. Python 3.8, standard library only; runs on the
target.
"""

DOCUMENTATION = r"""
---
module: dpkg_hold
short_description: Hold installed packages (dpkg selection C(hold)) in one dpkg call
version_added: "0.1.0"
description:
  - Reads every package dpkg knows with C(dpkg-query --show) and holds the installed ones that O(name) lists or
    that one of O(patterns) matches (C(re.match), as Ansible's C(match) test applies it).
  - A named package that is not installed is not held (dpkg has no such package to hold); it is returned in
    RV(skipped_unknown).
  - Holds are only added, never removed. Packages already held are left as they are.
options:
  name:
    description: Package names to hold when installed.
    type: list
    elements: str
    default: []
  patterns:
    description: Python regular expressions; every installed package that one matches (C(re.match)) is held.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    description: Reports what would be held (RV(newly_held)) and changes nothing.
    support: full
  diff_mode:
    description: Shows dpkg's holds before and after, one C(NAME hold) line each.
    support: full
author:
  - gpu-fleet-remediation maintainers !UNKNOWN
"""

EXAMPLES = r"""
- name: Hold the booted kernel's packages and the installed NVIDIA driver packages
  gpufleet.remediation.dpkg_hold:
    name: ["linux-image-{{ ansible_facts['kernel'] }}", "linux-modules-{{ ansible_facts['kernel'] }}"]
    patterns: ["^nvidia-driver-[0-9]", "^libnvidia-compute-[0-9]"]
"""

RETURN = r"""
held:
  description: The installed packages chosen, sorted; all of them are held when the module returns (not in check mode).
  type: list
  elements: str
  returned: always
newly_held:
  description: Those of RV(held) that were not held before this run (in check mode, that would be held).
  type: list
  elements: str
  returned: always
skipped_unknown:
  description: Names in O(name) that are not installed, sorted.
  type: list
  elements: str
  returned: always
held_before:
  description: Every package whose dpkg selection was C(hold) before this run, installed or not, sorted.
  type: list
  elements: str
  returned: always
"""

# Ansible's module layout: imports follow the documentation blocks.
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

#: One line per package and architecture: name, selection ("want") and state, tab-separated.
QUERY_FORMAT = "${Package}\t${db:Status-Want}\t${db:Status-Status}\n"
#: dpkg states in which a package has no files on the host (purged, or only its configuration left).
NOT_INSTALLED = frozenset(("not-installed", "config-files"))


def read_db(text):
    """``dpkg-query`` output (QUERY_FORMAT) -> (installed names, held names). A package installed for several
    architectures appears once; it counts as held when any of its lines is."""
    installed, held = set(), set()
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or not fields[0]:
            continue
        name, want, status = fields
        if status not in NOT_INSTALLED:
            installed.add(name)
        if want == "hold":
            held.add(name)
    return installed, held


def choose(installed, held, names, patterns):
    """The packages to hold, those of them newly held, and the named ones not installed (all sorted).
    ``patterns`` are compiled regexes."""
    chosen = {n for n in names if n in installed}
    if patterns:
        chosen.update(p for p in installed if any(r.match(p) for r in patterns))
    return sorted(chosen), sorted(chosen - held), sorted(set(names) - installed)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="list", elements="str", default=[]),
            patterns=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    compiled = []
    for pattern in module.params["patterns"]:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            module.fail_json(msg=f"patterns: {pattern!r} is not a regular expression ({exc}); fix the pattern")
    query = module.get_bin_path("dpkg-query", required=True)
    rc, out, err = module.run_command([query, "--show", "--showformat", QUERY_FORMAT, "*"])
    if rc != 0:
        module.fail_json(msg=f"dpkg-query --show failed (exit {rc}): {err.strip()[:500]}")
    installed, held_before = read_db(out)
    chosen, newly, skipped = choose(installed, held_before, module.params["name"], compiled)
    result = dict(
        changed=bool(newly), held=chosen, newly_held=newly, skipped_unknown=skipped, held_before=sorted(held_before)
    )
    if module._diff:
        result["diff"] = dict(
            before="".join(f"{p} hold\n" for p in sorted(held_before)),
            after="".join(f"{p} hold\n" for p in sorted(held_before | set(newly))),
        )
    if newly and not module.check_mode:
        dpkg = module.get_bin_path("dpkg", required=True)
        data = "".join(f"{p} hold\n" for p in newly)
        rc, out, err = module.run_command([dpkg, "--set-selections"], data=data, binary_data=True)
        if rc != 0:
            module.fail_json(msg=f"dpkg --set-selections failed (exit {rc}): {err.strip()[:500]}", **result)
        rc, out, err = module.run_command([query, "--show", "--showformat", QUERY_FORMAT, "*"])
        missing = sorted(set(newly) - read_db(out)[1]) if rc == 0 else newly
        if missing:  # verified, not assumed: dpkg's database says so
            module.fail_json(msg=f"dpkg did not record the hold of {', '.join(missing)}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
