"""Findings about one GPU host, from the audit's facts and from field text: the NVIDIA driver and kernel (S1),
GPU hardware faults that make GPU work fail (filed under S1, see :mod:`remediation.core.catalog`), and what makes GPU
work slow (temperature, throttling, configuration, memory pressure: S5)."""

from __future__ import annotations

from remediation.core.catalog.entry import CatalogEntry, Runbook
from remediation.core.findings import Scenario, Severity

__all__ = ["ENTRIES"]

# --- shared runbook text (S1) -------------------------------------------------------------------------------

_S1_SYMPTOMS = (
    "All GPU workloads fail although nobody deployed anything; the VM itself is healthy (SSH, CPU work, health "
    "checks pass). `nvidia-smi` prints: \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
    'driver. Make sure that the latest NVIDIA driver is installed and running." GPU containers do not start, '
    "training jobs are dead."
)
_S1_DIAGNOSIS = (
    "- `dmesg | grep -i nvidia` (look for: module nvidia not found in modules.dep)\n"
    "- `uname -r` (the booted kernel, e.g. 6.5.0-44-generic)\n"
    "- `find /lib/modules/$(uname -r) -name 'nvidia.ko*'` (DKMS builds in updates/dkms/, Ubuntu's signed packages in"
    " kernel/nvidia-<branch>/; .ko.zst on 24.04)\n"
    "- `dpkg -l | grep nvidia-driver` (the installed driver, e.g. nvidia-driver-535 535.183.01)\n"
    "- `grep -A 5 linux-image /var/log/apt/history.log` (did unattended-upgrade install a new kernel?)\n"
    "- `invoke diagnose FILE` on the nvidia-smi output, dmesg or apt history"
)
_S1_ROOT_CAUSE = (
    "unattended-upgrades installed a new kernel automatically. The NVIDIA kernel module is built against one "
    "kernel version; when the VM rebooted into the new kernel there was no matching NVIDIA module."
)
_S1_RESOLUTION = (
    "- Option A (Azure VMs): reinstall the driver extension: `az vm extension set --resource-group <resource-group> "
    "--vm-name <vm-name> --name NvidiaGpuDriverLinux --publisher Microsoft.HpcCompute --version 1.9`\n"
    "- Option B: hold the kernel and reinstall the driver: `sudo apt-mark hold linux-image-$(uname -r) "
    "linux-headers-$(uname -r)`; `sudo apt install linux-headers-$(uname -r)` then `sudo dkms autoinstall -k "
    "$(uname -r)` (DKMS builds the installed driver's module; reinstalling the `nvidia-driver-BRANCH` metapackage "
    "builds nothing: `sudo apt install --reinstall nvidia-dkms-BRANCH` does, with the branch whole: `535`, "
    "`535-server`, `535-open`); `sudo reboot` (only where a reboot is allowed)\n"
    "- Automated: `invoke driver-restore --limit <host>`, then verify with NVML (`invoke audit --limit <host>`)"
)
_S1_PREVENTION = (
    "- Blacklist kernel packages in /etc/apt/apt.conf.d/50unattended-upgrades: "
    '`Unattended-Upgrade::Package-Blacklist { "linux-image"; "linux-headers"; "linux-modules"; };` '
    "(roles/unattended_upgrades_blacklist; also the NVIDIA packages)\n"
    "- Hold the running kernel: `apt-mark hold linux-image-$(uname -r) linux-headers-$(uname -r)` "
    "(roles/gpu_kernel_hold)\n"
    "- Manage drivers with the Azure NVIDIA GPU Driver Extension; treat kernel upgrades as planned maintenance\n"
    "- Monitor nvidia-smi/NVML on every host (the failure is silent otherwise); run the predictive check for an "
    "installed kernel without a module (GPU-KRN-001)"
)

_HW_SYMPTOMS = (
    "GPU work fails or a GPU disappears although the driver is installed and loaded for the booted kernel; "
    "NVRM lines (Xid, fallen off the bus, RmInitAdapter) appear in the kernel log."
)
_HW_DIAGNOSIS = (
    "- `dmesg -T | grep -E 'NVRM|nvidia'` or `journalctl -k | grep NVRM` (Xid code, PCI bus id, pid)\n"
    "- `nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER` (uncorrected ECC, retired pages, remapped rows)\n"
    "- `nvidia-smi -L` and `lspci -d 10de:` (how many GPUs the OS and the driver see, against the VM SKU)\n"
    "- `invoke diagnose FILE` on the kernel log"
)
_HW_ROOT_CAUSE = (
    "A hardware or platform fault of the GPU (memory, bus, NVLink, firmware), not the kernel/driver mismatch of "
    "scenario S1. Reinstalling the driver does not help."
)
_HW_RESOLUTION = (
    "- Drain the host (cordon the AKS node / stop scheduling), save `nvidia-bug-report.sh` output\n"
    "- Reset the GPU where supported (`nvidia-smi -r -i <gpu-index>` with no processes on it) or reboot\n"
    "- On Azure: redeploy the VM to other hardware (`az vm redeploy -g <resource-group> -n <vm-name>`) or open a "
    "support case with "
    "the Xid lines and the bug report"
)
_HW_PREVENTION = (
    "- Alert on Xid events and on ECC/row-remapper counters (DCGM health watches, DCGM_FI_DEV_XID_ERRORS)\n"
    "- Run the fleet audit nightly so a host that lost a GPU is drained before jobs land on it"
)

_S5_SYMPTOMS = (
    'P99 latency jumps (e.g. 200 ms to 3 s) with no deployment and no configuration change: "the AI is slow".'
)
_S5_DIAGNOSIS = (
    "- `nvidia-smi --query-gpu=utilization.gpu,utilization.memory,temperature.gpu --format=csv -l 2`\n"
    "- `nvidia-smi -q -d PERFORMANCE` (clock event / throttle reasons)\n"
    "- `kubectl get pods -n inference -w`; `kubectl describe pod POD -n inference | grep -A 5 'Last State'`\n"
    "- `kubectl logs POD -n inference | grep -i 'model loaded\\|loading model'` (cold start time)"
)
_S5_ROOT_CAUSE = (
    "Usually a combination: container cold starts (pod evicted, weights reloaded over the network), GPU thermal "
    "throttling (sustained 100% utilisation, temperature above ~83 °C, automatic clock reduction), or a noisy "
    "neighbour on the same node."
)
_S5_RESOLUTION = (
    "- Thermal throttling: monitor DCGM_FI_DEV_GPU_TEMP and alert above 78 °C; lower the batch size to reduce "
    "sustained utilisation\n"
    "- Cold starts: an init container that copies weights to local NVMe; readiness only once the model is loaded\n"
    "- Noisy neighbours: nodeSelector or dedicated taints so inference pods run on exclusive nodes"
)
_S5_PREVENTION = (
    "- GPU temperature alerts (78 °C) and throttle-reason monitoring\n"
    "- Readiness probes that check the model is loaded; model cache on local NVMe\n"
    "- Inference pods on dedicated nodes without sharing"
)


def _s1(
    symptoms: str = _S1_SYMPTOMS,
    diagnosis: str = _S1_DIAGNOSIS,
    root_cause: str = _S1_ROOT_CAUSE,
    resolution: str = _S1_RESOLUTION,
    prevention: str = _S1_PREVENTION,
) -> Runbook:
    return Runbook(symptoms, diagnosis, root_cause, resolution, prevention)


def _hw(
    symptoms: str = _HW_SYMPTOMS,
    diagnosis: str = _HW_DIAGNOSIS,
    root_cause: str = _HW_ROOT_CAUSE,
    resolution: str = _HW_RESOLUTION,
    prevention: str = _HW_PREVENTION,
) -> Runbook:
    return Runbook(symptoms, diagnosis, root_cause, resolution, prevention)


def _s5(
    symptoms: str = _S5_SYMPTOMS,
    diagnosis: str = _S5_DIAGNOSIS,
    root_cause: str = _S5_ROOT_CAUSE,
    resolution: str = _S5_RESOLUTION,
    prevention: str = _S5_PREVENTION,
) -> Runbook:
    return Runbook(symptoms, diagnosis, root_cause, resolution, prevention)


_S1, _S5 = Scenario.S1, Scenario.S5
_C, _W, _I = Severity.CRITICAL, Severity.WARNING, Severity.INFO

ENTRIES: tuple[CatalogEntry, ...] = (
    # --- S1: driver ------------------------------------------------------------------------------------------
    CatalogEntry(
        "GPU-DRV-001",
        _S1,
        _C,
        "NVIDIA driver not loaded: the booted kernel has no NVIDIA module",
        "invoke driver-restore --limit {host}",
        _s1(
            diagnosis=_S1_DIAGNOSIS + "\n- `modinfo nvidia` / `modprobe nvidia` (FATAL: Module nvidia not found "
            "in directory /lib/modules/KERNEL confirms the cause)"
        ),
    ),
    CatalogEntry(
        "GPU-DRV-002",
        _S1,
        _C,
        "Driver/library version mismatch: userspace newer than the loaded kernel module",
        "invoke driver-restore --limit {host}",
        _s1(
            symptoms='`nvidia-smi` prints "Failed to initialize NVML: Driver/library version mismatch" (often '
            'with "NVML library version: X"); the kernel log says "API mismatch: the client has the version X, '
            'but this kernel module has the version Y".',
            diagnosis="- `cat /proc/driver/nvidia/version` (the loaded module)\n"
            "- `dpkg -l | grep -E 'nvidia-(driver|utils|compute)'` (the userspace packages)\n"
            "- `grep -E 'nvidia|libnvidia' /var/log/apt/history.log` (who upgraded them, and when)",
            root_cause="The NVIDIA userspace packages were upgraded (often by unattended-upgrades) while the old "
            "kernel module stayed loaded, or the new module was not built for the booted kernel.",
            resolution="- Reload the module when no process holds the GPUs: `sudo rmmod nvidia_uvm nvidia_drm "
            "nvidia_modeset nvidia && sudo modprobe nvidia`, or reboot where allowed\n"
            "- `invoke driver-restore --limit <host>` (rebuilds/reinstalls the module for the booted kernel)",
            prevention="- Blacklist NVIDIA packages in unattended-upgrades (roles/unattended_upgrades_blacklist)\n"
            "- `apt-mark hold` the driver packages; upgrade drivers as planned maintenance",
        ),
    ),
    CatalogEntry(
        "GPU-DRV-003",
        _S1,
        _C,
        "NVIDIA driver not installed: libnvidia-ml not found",
        "invoke driver-restore --limit {host}",
        _s1(
            symptoms='`nvidia-smi` is missing or NVML reports "NVML Shared Library Not Found" / '
            '"libnvidia-ml.so.1: cannot open shared object file"; nvidia-container-cli cannot load the library.',
            diagnosis="- `ldconfig -p | grep libnvidia-ml`\n- `dpkg -l | grep -E 'nvidia-(driver|utils)'`\n"
            "- `az vm extension list -g <resource-group> --vm-name <vm-name> -o table` (is NvidiaGpuDriverLinux "
            "installed?)",
            root_cause="The driver userspace was never installed, was removed (autoremove, purge), or the "
            "container runtime does not see it.",
        ),
    ),
    CatalogEntry(
        "GPU-DRV-004",
        _S1,
        _C,
        "NVML failed to initialise, cause unknown",
        "invoke driver-restore --limit {host}",
        _s1(
            root_cause="NVML did not initialise and the text does not say why. The usual cause (S1) is a booted "
            "kernel without an NVIDIA module after an unattended kernel upgrade; confirm with `modinfo nvidia` "
            "and the kernel log before acting."
        ),
    ),
    CatalogEntry(
        "GPU-DRV-005",
        _S1,
        _W,
        "Driver version drift against the fleet's expected version or majority",
        "invoke driver-restore --limit {host}",
        _s1(
            symptoms="Hosts of one fleet run different NVIDIA driver versions; jobs behave differently per host.",
            diagnosis="- `invoke audit` (driver version per host against the fleet's expected version)\n"
            "- `nvidia-smi --query-gpu=driver_version --format=csv,noheader`",
            root_cause="Drivers upgraded on some hosts (unattended-upgrades, manual installs, new images) and not "
            "on others.",
        ),
    ),
    CatalogEntry(
        "GPU-DRV-006",
        _S1,
        _C,
        "NVML hung: the probe timed out",
        "invoke driver-restore --limit {host}",
        _s1(
            symptoms="`nvidia-smi` hangs; the probe times out instead of answering.",
            diagnosis="- `dmesg | grep -E 'NVRM|Xid'` (a GPU stuck after an Xid)\n"
            "- `ps -eo pid,stat,cmd | grep nvidia` (processes in D state)",
            root_cause="A GPU or the driver is wedged (often after an Xid or a GPU falling off the bus), so NVML "
            "calls block.",
            resolution="- Drain the host; reset the GPU (`nvidia-smi -r`) or reboot where allowed\n"
            "- On Azure, redeploy the VM if the hang persists after reboot",
        ),
    ),
    CatalogEntry(
        "GPU-DRV-007",
        _S1,
        _C,
        "NVIDIA kernel module API mismatch in the kernel log",
        "invoke driver-restore --limit {host}",
        _s1(
            symptoms='Kernel log: "NVRM: API mismatch: the client has the version X, but this kernel module has '
            "the version Y. Please make sure that this kernel module and all NVIDIA driver components have the "
            'same version."',
            diagnosis="- `cat /proc/driver/nvidia/version`; `dpkg -l | grep nvidia`\n"
            "- `grep -E 'nvidia' /var/log/apt/history.log`",
            root_cause="Userspace driver components and the loaded kernel module come from different driver "
            "versions (a partial upgrade, or a module not rebuilt).",
            resolution="- Reload the module or reboot where allowed; `invoke driver-restore --limit <host>`",
        ),
    ),
    CatalogEntry(
        "GPU-DRV-008",
        _S1,
        _C,
        "NVIDIA module present but rejected by Secure Boot (unsigned module)",
        "invoke driver-restore --limit {host}",
        _s1(
            symptoms='`nvidia-smi` cannot communicate with the driver although nvidia.ko exists for the booted '
            "kernel; `modprobe nvidia` prints \"modprobe: ERROR: could not insert 'nvidia': Key was rejected by "
            'service" (older kernels: "Required key not available"); the kernel log says "Lockdown: modprobe: '
            'unsigned module loading is restricted; see man kernel_lockdown.7".',
            diagnosis="- `mokutil --sb-state` (SecureBoot enabled: Trusted Launch VMs on Azure)\n"
            "- `modinfo nvidia | grep -E 'filename|signer|sig_key'` (updates/dkms and no signer: a DKMS build)\n"
            "- `dmesg | grep -E 'Lockdown|Key was rejected'`; `journalctl -b -u systemd-modules-load`\n"
            "- `dpkg -l 'linux-modules-nvidia-*'` (is the signed precompiled package installed?)",
            root_cause="Secure Boot is on (Azure Trusted Launch) and the module DKMS built is not signed with a key "
            "the kernel trusts (DKMS's own MOK needs enrolling at the VM console, which an unattended cloud VM does "
            "not have), so the kernel refuses it. Rebuilding with DKMS does not help.",
            resolution="- Install Ubuntu's signed precompiled module for the booted kernel: `sudo apt install "
            "linux-modules-nvidia-BRANCH-$(uname -r)` (and the `linux-modules-nvidia-BRANCH-azure` meta-package), "
            "where BRANCH is the installed driver's whole branch (`535-server` for `nvidia-driver-535-server`: "
            "the plain `535` package belongs to another driver and its module lives in `kernel/nvidia-535`, not "
            "`kernel/nvidia-535srv`), remove the DKMS build (`sudo dkms remove nvidia/VER -k $(uname -r)`), reboot\n"
            "- Automated: `invoke driver-restore --limit <host> --allow-reboot` (picks the signed package when Secure "
            "Boot is on)",
            prevention="- On Secure Boot hosts use the signed module packages, not DKMS "
            "(`driver_restore.module_source: auto`)\n"
            "- Move kernels with `invoke kernel-update`: gate 1 refuses a module Secure Boot would reject before any "
            "reboot",
        ),
    ),
    # --- S1: kernel / packages -------------------------------------------------------------------------------
    CatalogEntry(
        "GPU-KRN-001",
        _S1,
        _W,
        "Predictive: an installed kernel newer than the booted one has no NVIDIA module; the next reboot breaks "
        "the GPUs",
        "invoke driver-restore --limit {host}",
        _s1(
            symptoms="Nothing yet: the GPUs work. After the next reboot the host boots the newer kernel and "
            "`nvidia-smi` fails (GPU-DRV-001).",
            diagnosis="- `ls /boot/vmlinuz-*` against `uname -r`\n"
            "- `dkms status` and `ls /lib/modules/KERNEL/updates/dkms/` for each installed kernel",
            root_cause="A kernel was installed (usually by unattended-upgrades) and DKMS did not build the NVIDIA "
            "module for it, or the prebuilt linux-modules-nvidia package for it is missing.",
            resolution="- Build the module now: `sudo dkms autoinstall -k <kernel>` (or install "
            "linux-modules-nvidia-VER-KERNEL)\n- Or remove the new kernel and hold the booted one "
            "(roles/gpu_kernel_hold)",
        ),
    ),
    CatalogEntry(
        "GPU-KRN-002",
        _S1,
        _W,
        "Booted kernel packages not held",
        "roles/gpu_kernel_hold",
        _s1(
            symptoms="`apt-mark showhold` does not list linux-image-$(uname -r) / linux-headers-$(uname -r).",
            diagnosis="- `apt-mark showhold`\n- `uname -r`",
        ),
    ),
    CatalogEntry(
        "GPU-KRN-003",
        _S1,
        _W,
        "unattended-upgrades would upgrade kernel packages: Package-Blacklist missing or ineffective",
        "roles/unattended_upgrades_blacklist",
        _s1(
            symptoms="`unattended-upgrade --dry-run --debug` lists linux-image/linux-headers/linux-modules "
            "packages among the packages it would upgrade.",
            diagnosis="- `apt-config dump | grep -i Package-Blacklist`\n"
            "- `unattended-upgrade --dry-run --debug 2>&1 | grep -E 'linux-(image|headers|modules)'`",
        ),
    ),
    CatalogEntry(
        "GPU-KRN-004",
        _S1,
        _W,
        "unattended-upgrades would upgrade NVIDIA driver packages",
        "roles/unattended_upgrades_blacklist",
        _s1(
            symptoms="NVIDIA packages (nvidia-*, libnvidia-*) are upgraded automatically, which leads to "
            '"Driver/library version mismatch" until the module is reloaded.',
            diagnosis="- `grep -B3 -A5 nvidia /var/log/apt/history.log` (Commandline: /usr/bin/unattended-upgrade)\n"
            "- `apt-config dump | grep -i Package-Blacklist`",
            root_cause="The unattended-upgrades Package-Blacklist does not cover the NVIDIA driver packages.",
        ),
    ),
    CatalogEntry(
        "GPU-KRN-005",
        _S1,
        _I,
        "Reboot required by installed packages",
        "plan a reboot window (playbooks with serial batches; never an implicit reboot)",
        _s1(
            symptoms="/var/run/reboot-required exists; /var/run/reboot-required.pkgs lists the packages.",
            diagnosis="- `cat /var/run/reboot-required.pkgs`\n- check GPU-KRN-001 before rebooting",
        ),
    ),
    CatalogEntry(
        "GPU-KRN-006",
        _S1,
        _I,
        "Kernel or NVIDIA packages installed automatically by unattended-upgrade (evidence for the root cause)",
        "roles/unattended_upgrades_blacklist",
        _s1(),
    ),
    CatalogEntry(
        "GPU-DKMS-001",
        _S1,
        _W,
        "DKMS did not build the NVIDIA module for a kernel (build failed / headers missing)",
        "invoke driver-restore --limit {host}",
        _s1(
            symptoms='`dkms status` lacks an `installed` line for a kernel; the DKMS output says "Bad return '
            'status for module build on kernel: K" or "Skipping kernel K (headers not installed)".',
            diagnosis="- `dkms status`\n- `cat /var/lib/dkms/nvidia/VERSION/build/make.log`\n"
            "- `dpkg -l linux-headers-<kernel>`",
            root_cause="The kernel headers for that kernel are missing, or the driver version does not build "
            "against that (too new) kernel.",
            resolution="- `sudo apt install linux-headers-<kernel> && sudo dkms autoinstall -k <kernel>`\n"
            "- If the driver cannot build for that kernel: hold the working kernel (roles/gpu_kernel_hold) and "
            "remove the new one, or move to a driver branch that supports it\n"
            "- `invoke driver-restore --limit <host>`",
        ),
    ),
    CatalogEntry(
        "GPU-APT-001",
        _S1,
        _W,
        "dpkg/apt lock held",
        "wait for the running apt/dpkg process, then rerun",
        _s1(
            symptoms='apt/dpkg report "Could not get lock /var/lib/dpkg/lock-frontend"; the remediation cannot '
            "install packages.",
            diagnosis="- `sudo lsof /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock`\n"
            "- `systemctl status unattended-upgrades apt-daily-upgrade.service`",
            root_cause="Another apt/dpkg process (often unattended-upgrades) holds the lock.",
            resolution="- Wait for it to finish; never delete the lock files. Rerun the remediation afterwards.",
        ),
    ),
    # --- S1: hardware faults that make GPU work fail (see the module docstring) -------------------------------
    CatalogEntry(
        "GPU-HW-001",
        _S1,
        _C,
        "GPU has fallen off the bus / GPU lost (Xid 79): not a driver problem",
        "az vm redeploy --resource-group <resource-group> --name {host} (or open a support case)",
        _hw(
            symptoms='Kernel log: "NVRM: GPU at PCI:... has fallen off the bus" / Xid 79; nvidia-smi reports '
            '"Unable to determine the device handle for GPU ...: GPU is lost".'
        ),
    ),
    CatalogEntry(
        "GPU-HW-002",
        _S1,
        _C,
        "Fewer GPUs than the VM SKU has",
        "az vm redeploy --resource-group <resource-group> --name {host} (or open a support case)",
        _hw(
            symptoms="`nvidia-smi -L` lists fewer GPUs than the SKU (e.g. 8 on ND96asr_v4); jobs asking for all "
            "GPUs fail."
        ),
    ),
    CatalogEntry(
        "GPU-HW-003",
        _S1,
        _C,
        "Uncorrected ECC errors",
        "drain and reset the GPU; az vm redeploy --resource-group <resource-group> --name {host} if they persist",
        _hw(
            symptoms="Xid 48 / 94 / 95; `nvidia-smi -q -d ECC` shows volatile or aggregate uncorrectable "
            "(double-bit) errors."
        ),
    ),
    CatalogEntry(
        "GPU-HW-004",
        _S1,
        _C,
        "Retired pages / remapped rows beyond limits, pending remap or remap failure",
        "reset the GPU to apply pending remaps; az vm redeploy --resource-group <resource-group> --name {host} "
        "past the limits",
        _hw(
            symptoms="Xid 63/64; `nvidia-smi -q -d PAGE_RETIREMENT,ROW_REMAPPER` shows pending remaps, a remap "
            "failure, or counts past DCGM's limits (63 retired pages in total, 15 double-bit retired pages, 512 "
            "uncorrectable remapped rows)."
        ),
    ),
    CatalogEntry(
        "GPU-HW-005",
        _S1,
        _W,
        "Xid events since boot (severity by Xid code)",
        "by the Xid's class (the finding names the one for its code): a hardware/driver Xid (48, 63, 64, 74, 92, "
        "94, 95, 119, 120...): drain the host; reset the GPU or redeploy the VM as the Xid's catalog entry says; an "
        "application-class Xid (13, 31, 43): check the application first, and drain only when it repeats on this "
        "GPU across several workloads",
        _hw(),
    ),
    CatalogEntry(
        "GPU-HW-006",
        _S1,
        _C,
        "NVML cannot get a device handle: Unknown Error",
        "drain and reboot; az vm redeploy --resource-group <resource-group> --name {host} if it persists",
        _hw(symptoms='nvidia-smi: "Unable to determine the device handle for GPU ...: Unknown Error".'),
    ),
    CatalogEntry(
        "GPU-HW-007",
        _S1,
        _C,
        "No devices found / RmInitAdapter failed",
        "reboot; az vm redeploy --resource-group <resource-group> --name {host} (or open a support case)",
        _hw(
            symptoms='nvidia-smi: "No devices were found"; kernel log: "NVRM: RmInitAdapter failed! (0x..)" '
            '/ "rm_init_adapter failed, device minor number N".'
        ),
    ),
    CatalogEntry(
        "GPU-HW-008",
        _S1,
        _C,
        "NVIDIA probe routine failed / not called (another driver owns the device)",
        "invoke driver-restore --limit {host}",
        _hw(
            symptoms='Kernel log: "NVRM: The NVIDIA probe routine was not called for N device(s)" or '
            '"nvidia: probe of 0000:... failed with error -1".',
            diagnosis="- `lspci -nnk -d 10de:` (which driver is in use: nouveau, vfio-pci?)\n"
            "- `lsmod | grep -E 'nouveau|vfio'`",
            root_cause="Another driver (nouveau, vfio-pci) claimed the GPU first, or the device failed initialisation.",
            resolution="- Blacklist nouveau (`/etc/modprobe.d/blacklist-nouveau.conf`), `update-initramfs -u`, "
            "reboot where allowed\n- If no other driver owns it: treat as a hardware fault (redeploy)",
        ),
    ),
    # --- S5: health that makes GPU work slow ---------------------------------------------------------------
    CatalogEntry(
        "GPU-THM-001",
        _S5,
        _W,
        "GPU temperature at or above the alert threshold (default 78 °C)",
        "lower sustained load (batch size); check cooling; alert on DCGM_FI_DEV_GPU_TEMP > 78",
        _s5(),
    ),
    CatalogEntry(
        "GPU-THM-002",
        _S5,
        _C,
        "GPU temperature at or above the slowdown threshold",
        "drain the GPU's work; check cooling; redeploy the VM if it persists",
        _s5(),
    ),
    CatalogEntry(
        "GPU-THM-003",
        _S5,
        _W,
        "Active thermal/power throttle (clock event) reasons",
        "lower sustained load (batch size) or power draw; check cooling",
        _s5(),
    ),
    CatalogEntry(
        "GPU-CFG-001",
        _S5,
        _W,
        "Persistence mode off",
        "nvidia-persistenced (roles/gpu_persistence) or `nvidia-smi -pm 1`",
        _s5(
            root_cause="Without persistence mode the driver tears the GPU state down when the last client exits "
            "and rebuilds it for the next one: slow first calls and model-server start-up."
        ),
    ),
    CatalogEntry(
        "GPU-MEM-001",
        _S5,
        _W,
        "GPU memory nearly full (with the processes holding it)",
        "stop or move the processes holding GPU memory; reduce batch size",
        _s5(
            root_cause="Another process (a stale job, a neighbour pod) holds GPU memory, so the model server "
            "runs with smaller batches or fails allocations."
        ),
    ),
)
