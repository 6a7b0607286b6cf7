"""``invoke lab.*``: the simulated GPU fleet the tests, the demo and game days run on."""

from __future__ import annotations

from typing import Any

from invoke import Collection, task

from commands import edge, project_dir, required_flags

FAULTS = (
    "kernel-upgrade",
    "driver-mismatch",
    "thermal",
    "ecc",
    "xid-79",
    "gpu-missing",
    "memory-full",
    "unreachable",
    "apt-lock",
    "hang",
    "gpu-job",
    "secure-boot",
    "dkms-build-fail",
    "new-kernel-panic",
    "fails-under-load",
)


def the_lab(c: Any) -> Any:
    """The lab of this project, from ``lab:`` in the config (relative paths under the project directory)."""
    from lab.config import LabConfig
    from lab.control import Lab

    return Lab(LabConfig.from_mapping(c.config.get("lab", {}), root=project_dir(c)))


@task(
    help={
        "hosts": "number of hosts, gpu-1 .. gpu-N (1-1000; 254 per /24: gpu-255 is <prefix+1>.1)",
        "flavour": "kernel flavour of hosts created now: azure or generic (default: lab.flavour, else the VM"
        " size's: azure for Azure sizes)",
        "secure_boot": "hosts created now are Trusted Launch VMs: Secure Boot on, signed NVIDIA module"
        " (default: lab.secure_boot)",
        "driver_branch": "NVIDIA driver branch of hosts created now: 535, 535-server or 535-open (default:"
        " lab.driver_branch, else 535; a host's nvidia_driver_branch in lab.host_overrides wins)",
        "release": "Ubuntu release of hosts created now: jammy (22.04, 6.5 kernels) or noble (24.04, 6.8 kernels,"
        " .ko.zst modules) (default: lab.release, jammy; lab.host_overrides.<host>.release wins)",
    }
)
@edge
def up(c, hosts=3, flavour=None, secure_boot=False, driver_branch=None, release=None):  # type: ignore[no-untyped-def]
    """Start the simulated GPU fleet (builds and caches the base image on first use)."""
    from lab.report import print_lab_up

    result = the_lab(c).up(
        int(hosts), flavour=flavour, secure_boot=True if secure_boot else None, driver_branch=driver_branch,
        release=release,
    )
    print_lab_up(result)


@task(help={"purge": "also delete the hosts' disks, keys and the lab inventory (the base cache stays)"})
@edge
def down(c, purge=False):  # type: ignore[no-untyped-def]
    """Stop every lab host and the supervisor; no process or mount is left behind."""
    stopped = the_lab(c).down(purge=purge)
    print(f"stopped {len(stopped)} host(s)" + (": " + ", ".join(stopped) if stopped else ""))


@task(name="status")
@edge
def lab_status(c):  # type: ignore[no-untyped-def]
    """Show each lab host: state, SSH, booted kernel, boot id, faults."""
    from lab.report import print_lab_status

    print_lab_status(the_lab(c).status())


@task(help={"host": "lab host to reboot, e.g. gpu-2", "no_wait": "return without waiting for SSH to come back"})
@edge
def reboot(c, host, no_wait=False):  # type: ignore[no-untyped-def]
    """Reboot one lab host (only that host: it is a namespace, never the machine)."""
    boot_id = the_lab(c).reboot(host, wait=not no_wait)
    print(f"{host} rebooted" + (f" (boot id {boot_id})" if boot_id else ""))


@task(help={"host": "lab host, e.g. gpu-2", "fault": "one of: " + ", ".join(FAULTS)})
@edge
def fault(c, host=None, fault=None):  # type: ignore[no-untyped-def]
    """Give a lab host a fault with the symptoms a real GPU VM shows (--host and --fault are required)."""
    from lab.faults import inject

    required_flags("lab.fault", host=host, fault=fault)

    result = inject(the_lab(c), host, fault)
    print(f"{result.host}: {result.fault}: {result.detail}")


@task(help={"host": "lab host to return to its freshly built state"})
@edge
def clear(c, host):  # type: ignore[no-untyped-def]
    """Undo every fault on a lab host (the host is rebuilt from the base; its address and keys stay)."""
    the_lab(c).clear(host)
    print(f"{host}: cleared")


ns: Any = Collection("lab", up, down, lab_status, reboot, fault, clear)
