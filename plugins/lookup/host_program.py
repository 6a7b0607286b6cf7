# Apache-2.0 (see the project's pyproject.toml)
"""Lookup: the path, on the controller, of a program the project runs on GPU hosts.

The programs are files of the project's Python package (``gpu-fleet-remediation``), found in the Python that runs
Ansible the way Python finds them: the roles copy the same file the SSH fan-out sends, wherever the package is
installed (a virtualenv, the execution environment, the checkout's own ``.venv``), never through a path into a
repository.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: host_program
short_description: Path of a host-side program of the gpu-fleet-remediation Python package
version_added: "0.1.0"
description:
  - Returns the path, on the controller, of a program of the installed Python package C(gpu-fleet-remediation)
    that the roles copy to GPU hosts (the host programs are the modules of its package C(remediation.hostside));
    the same file the SSH fan-out of C(invoke audit), C(invoke train.monitor) and the rollout leases sends over SSH.
  - The package is found in the Python that runs Ansible; without it the lookup fails naming the package.
options:
  _terms:
    description:
      - Program names. C(gpuprobe) is the host probe, a package (the path is its directory,
        C(remediation/hostside/gpuprobe), whose C(*.py) files are its modules); C(gpumemlog) is the GPU memory sampler
        (C(remediation/hostside/sampler.py)); C(rolloutlease) is the host lease program
        (C(remediation/hostside/hostlease.py)).
    type: list
    elements: str
    required: true
author:
  - gpu-fleet-remediation maintainers !UNKNOWN
"""

EXAMPLES = r"""
- name: Install the GPU memory sampler the train monitor runs
  ansible.builtin.copy:
    src: "{{ lookup('gpufleet.remediation.host_program', 'gpumemlog') }}"
    dest: /usr/local/lib/gpufleet/gpumemlog.py
    mode: "0644"

- name: Install the probe package the audit runs, module by module
  ansible.builtin.copy:
    src: "{{ item }}"
    dest: "/usr/local/lib/gpufleet/gpuprobe/{{ item | basename }}"
    mode: "0644"
  loop: "{{ query('ansible.builtin.fileglob', lookup('gpufleet.remediation.host_program', 'gpuprobe') ~ '/*.py') }}"
"""

RETURN = r"""
_raw:
  description: One absolute path per program name (a directory for a package).
  type: list
  elements: path
"""

# Ansible's plugin layout: imports follow the documentation blocks.
import importlib.util  # noqa: E402
import os  # noqa: E402

from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402

# name -> (package, file in that package, or a directory: a package of its own); the package is located without being
# imported (find_spec imports only its parents), so the lookup stays cheap.
PROGRAMS = {
    "gpuprobe": ("remediation.hostside", "gpuprobe/"),
    "gpumemlog": ("remediation.hostside", "sampler.py"),
    "rolloutlease": ("remediation.hostside", "hostlease.py"),
}


def program_path(name):
    if name not in PROGRAMS:
        raise AnsibleLookupError(f"unknown host program {name!r}; known: {', '.join(sorted(PROGRAMS))}")
    package, filename = PROGRAMS[name]
    try:
        spec = importlib.util.find_spec(package)
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise AnsibleLookupError(
            f"host program {name!r} is part of the Python package gpu-fleet-remediation, which the Python that "
            f"runs Ansible cannot import ({package}); install it there with pip (the collection's requirements.txt), "
            "or use the gpufleet execution environment"
        )
    for location in spec.submodule_search_locations:
        path = os.path.join(location, filename.rstrip("/"))
        found = os.path.isfile(os.path.join(path, "__init__.py")) if filename.endswith("/") else os.path.isfile(path)
        if found:
            return os.path.realpath(path)
    raise AnsibleLookupError(f"host program {name!r}: {filename} is missing from the installed package {package}")


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        return [program_path(str(term)) for term in terms]
