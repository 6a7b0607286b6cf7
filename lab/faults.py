"""Faults a lab host can be given, each producing the symptoms a real GPU VM shows.

Software faults act inside the host with its own tools (the real ``unattended-upgrade``, ``apt-get``);
hardware faults change the host's GPU state (``hw/gpus``) and write what the kernel would log.
``lab.clear`` undoes all of them by returning the host to its freshly built state.

``LATENT`` faults show nothing until the host next meets them (a reboot, a kernel install, a GPU load): they are kept
apart from ``FAULTS``, the audit's fault matrix, because a host that has one still audits healthy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from . import hardware, packages
from .control import Lab, require_root
from .errors import LabError


@dataclass(frozen=True)
class FaultResult:
    host: str
    fault: str
    detail: str


def _hw(lab: Lab, host: str, change: Callable[[hardware.State], str]) -> str:
    path = lab.paths.host(host) / "hw/gpus"
    state = hardware.read_state(path)
    detail = change(state)
    hardware.write_state(path, state)
    return detail


def kernel_upgrade(lab: Lab, host: str) -> str:
    """S1: unattended-upgrades installs the newer kernel from the -security pocket, then the host reboots."""
    lab.run_in_host(host, ["apt-get", "update", "-q"])
    run = lab.run_in_host(host, ["unattended-upgrade", "-v"], timeout=600, check=False)
    if run.returncode != 0:
        raise LabError(f"unattended-upgrade failed on {host} (exit {run.returncode}); see its console.log")
    lab.reboot(host, wait=True)
    kernel = (lab.host_path(host, "/run/gpulab/kernel").read_text()).strip()
    return f"unattended-upgrade ran; {host} rebooted into {kernel}"


def driver_mismatch(lab: Lab, host: str) -> str:
    """NVML error 18: the driver's userspace is upgraded while the old kernel module stays loaded."""
    new = packages.driver_version(packages.DRIVERS[1], lab.release(host))
    branch = packages.common_branch(lab.driver_branch(host))  # utils and libnvidia-compute: -open shares them
    lab.run_in_host(host, ["apt-get", "update", "-q"])
    lab.run_in_host(
        host,
        [
            "apt-get",
            "install",
            "-y",
            "-q",
            f"nvidia-driver-{lab.driver_branch(host)}={new}",
            f"nvidia-utils-{branch}={new}",
            f"libnvidia-compute-{branch}={new}",
        ],
        timeout=300,
    )
    loaded = (lab.host_path(host, "/run/gpulab/module").read_text()).strip()
    client = packages.DRIVERS[1]
    lab.append_kmsg(
        host,
        [
            f"NVRM: API mismatch: the client has the version {client}, but",
            f"NVRM: this kernel module has the version {loaded}.  Please",
            "NVRM: make sure that this kernel module and all NVIDIA driver",
            "NVRM: components have the same version.",
        ],
    )
    return f"userspace {client} installed without reboot; loaded module still {loaded}"


def thermal(lab: Lab, host: str) -> str:
    def change(s: hardware.State) -> str:
        s.update(
            {
                "gpu.0.temperature": "86",
                "gpu.0.util_gpu": "100",
                "gpu.0.util_memory": "71",
                "gpu.0.power_mw": "281000",
                "gpu.0.clock_graphics": "1005",
                "gpu.0.clock_sm": "1005",
                "gpu.0.clocks_event_reasons": hex(hardware.HW_SLOWDOWN | hardware.HW_THERMAL_SLOWDOWN),
            }
        )
        return "GPU 0 at 86 C with hardware thermal slowdown, SM clock 1005 MHz"

    return _hw(lab, host, change)


def ecc(lab: Lab, host: str) -> str:
    def change(s: hardware.State) -> str:
        s.update(
            {
                "gpu.0.ecc_volatile_uncorrected": "2",
                "gpu.0.ecc_aggregate_uncorrected": "2",
                "gpu.0.ecc_volatile_corrected": "14",
                "gpu.0.ecc_aggregate_corrected": "14",
                "gpu.0.remapped_uncorrectable": "1",
                "gpu.0.remap_pending": "1",
            }
        )
        return "GPU 0: 2 uncorrected ECC errors, 1 row pending remap"

    detail = _hw(lab, host, change)
    pci = hardware.pci_short(hardware.read_state(lab.paths.host(host) / "hw/gpus"), 0)
    lab.append_kmsg(
        host,
        [
            f"NVRM: Xid (PCI:{pci}): 94, pid=48211, name=python3, Contained ECC error",
            f"NVRM: Xid (PCI:{pci}): 63, pid='<unknown>', name=<unknown>, Row Remapping: New row marked for"
            " remapping, reset gpu to activate.",
        ],
    )
    return detail


def xid_79(lab: Lab, host: str) -> str:
    path = lab.paths.host(host) / "hw/gpus"
    state = hardware.read_state(path)
    last = hardware.gpu_count(state) - 1
    if last < 0:
        raise LabError(f"{host} has no GPU left to fall off the bus")
    state[f"gpu.{last}.lost"] = "1"
    hardware.write_state(path, state)
    short, long = hardware.pci_short(state, last), hardware.pci_long(state, last)
    lab.append_kmsg(
        host,
        [
            f"NVRM: Xid (PCI:{short}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            f"NVRM: GPU {long}: GPU has fallen off the bus.",
            f"NVRM: GPU {long}: GPU serial number is {state.get(f'gpu.{last}.serial', '')}.",
        ],
    )
    return f"GPU {last} ({long}) fell off the bus"


def gpu_missing(lab: Lab, host: str) -> str:
    def change(s: hardware.State) -> str:
        count = hardware.gpu_count(s)
        if count == 0:
            raise LabError(f"{host} has no GPU left to remove")
        s["gpu_count"] = str(count - 1)
        return f"{count - 1} of {count} GPUs on the bus"

    detail = _hw(lab, host, change)
    lab.append_kmsg(host, ["NVRM: The NVIDIA probe routine failed for 1 device(s)."])
    return detail


def memory_full(lab: Lab, host: str) -> str:
    def change(s: hardware.State) -> str:
        total = int(s["gpu.0.memory_total"])
        used = int(total * 0.97)
        s.update(
            {
                "gpu.0.memory_used": str(used),
                "gpu.0.util_gpu": "98",
                "gpu.0.util_memory": "64",
                "gpu.0.clock_graphics": "1410",
                "gpu.0.clock_sm": "1410",
                "gpu.0.clocks_event_reasons": "0x0",
                "gpu.0.procs": f"48211:{used - 512 * 1024 * 1024}:python3;48377:{512 * 1024 * 1024}:tritonserver",
            }
        )
        return f"GPU 0 memory {used // 2**20} MiB of {total // 2**20} MiB used by 2 processes"

    return _hw(lab, host, change)


def unreachable(lab: Lab, host: str) -> str:
    lab.run_in_host(host, ["/etc/init.d/ssh", "stop"])
    return "sshd stopped"


def apt_lock(lab: Lab, host: str) -> str:
    holder = (
        "import fcntl, time\n"
        "f = open('/var/lib/dpkg/lock-frontend', 'a'); fcntl.lockf(f, fcntl.LOCK_EX)\n"
        "g = open('/var/lib/dpkg/lock', 'a'); fcntl.lockf(g, fcntl.LOCK_EX)\n"
        "time.sleep(10**9)\n"
    )
    lab.run_in_host(host, ["python3", "-c", holder], detach=True)
    return "a process holds /var/lib/dpkg/lock-frontend and /var/lib/dpkg/lock"


JOB = (
    "import os, sys, time\n"
    "fds = [os.open(p, os.O_RDWR) for p in ('/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia0')]\n"
    "open('/run/gpulab/job.pid', 'w').write(str(os.getpid()))\n"
    "time.sleep(10**9)\n"
)


def gpu_job(lab: Lab, host: str) -> str:
    """A training job on GPU 0: a process holding /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia0 open, as
    a CUDA process does; NVML lists it while NVML answers, /proc shows it whatever NVML does. A reboot ends it."""
    if not lab.host_path(host, "/dev/nvidia0").exists():
        raise LabError(f"{host} has no /dev/nvidia0 (the NVIDIA module is not loaded): a GPU job cannot start there")
    pid_file = lab.host_path(host, "/run/gpulab/job.pid")
    pid_file.unlink(missing_ok=True)
    lab.run_in_host(host, ["python3", "-c", JOB], detach=True)
    for _ in range(200):
        pid = pid_file.read_text().strip() if pid_file.exists() else ""
        if pid:
            return f"job pid {pid} (python3) holds /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm"
        time.sleep(0.05)
    raise LabError(f"the GPU job on {host} did not start within 10 s; see the host's console.log")


def hang(lab: Lab, host: str) -> str:
    def change(s: hardware.State) -> str:
        s["hang"] = "1"
        return "NVML calls block"

    return _hw(lab, host, change)


def _booted(lab: Lab, host: str) -> str:
    return lab.host_path(host, "/run/gpulab/kernel").read_text().strip()


def secure_boot(lab: Lab, host: str) -> str:
    """Trusted Launch turned on in the host's firmware: effective from its next boot (an unsigned NVIDIA module
    will not load then)."""
    lab.set_firmware(host, secure_boot=True)
    return "Secure Boot enabled in the firmware (effective at the next boot)"


def dkms_build_fail(lab: Lab, host: str) -> str:
    """DKMS fails to build the NVIDIA module for any kernel newer than the booted one (make.log has the
    compiler's error; dkms exits 10)."""
    booted = _booted(lab, host)
    marker = lab.host_path(host, "/var/lib/gpulab/dkms-build-fail")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(booted + "\n")
    return f"DKMS builds of the NVIDIA module fail for kernels newer than {booted}"


def new_kernel_panic(lab: Lab, host: str) -> str:
    """The host panics at boot on any kernel newer than the booted one (root fs not found), stays down ~3 s and
    restarts, choosing from grub.cfg again (a one-shot grub-reboot entry is used up by the boot that panicked)."""
    booted = _booted(lab, host)
    (lab.paths.host(host) / "panic-above").write_text(booted + "\n")
    return f"kernels newer than {booted} panic at boot (VFS: Unable to mount root fs)"


def fails_under_load(lab: Lab, host: str) -> str:
    """GPU 0 answers NVML while idle and is lost under load ("healthy after reboot" that fails under load): with
    the lab NVML's load hook on (``/run/gpulab/load``, written by the load gate's host program) every call on it
    returns ``NVML_ERROR_GPU_IS_LOST``. Idle, the host audits healthy."""

    def change(s: hardware.State) -> str:
        s["gpu.0.fail_under_load"] = "1"
        return "GPU 0 is lost whenever it is under load (idle, it answers NVML)"

    return _hw(lab, host, change)


FAULTS: dict[str, Callable[[Lab, str], str]] = {
    "kernel-upgrade": kernel_upgrade,
    "driver-mismatch": driver_mismatch,
    "thermal": thermal,
    "ecc": ecc,
    "xid-79": xid_79,
    "gpu-missing": gpu_missing,
    "memory-full": memory_full,
    "unreachable": unreachable,
    "apt-lock": apt_lock,
    "hang": hang,
}
# Faults that stay hidden until a reboot or a kernel install meets them (not in the audit's fault matrix).
LATENT: dict[str, Callable[[Lab, str], str]] = {
    "secure-boot": secure_boot,
    "dkms-build-fail": dkms_build_fail,
    "new-kernel-panic": new_kernel_panic,
    "fails-under-load": fails_under_load,
}
# Conditions that are not faults (a healthy host shows them too) but that guards must see.
WORKLOADS: dict[str, Callable[[Lab, str], str]] = {
    "gpu-job": gpu_job,
}


def inject(lab: Lab, host: str, fault: str) -> FaultResult:
    require_root()
    known = {**FAULTS, **LATENT, **WORKLOADS}
    if fault not in known:
        raise LabError(f"unknown fault {fault!r}; known faults: {', '.join(known)}")
    lab.spec(host)  # names the host and the lab's hosts when it is not there
    lab.init_pid(host)
    detail = known[fault](lab, host)
    lab.record_fault(host, fault)
    return FaultResult(host, fault, detail)
