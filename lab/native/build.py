"""Build the lab's native pieces: a file-driven ``libnvidia-ml.so.1`` and the ``uname`` preload.

Stdlib only.  ``build_native(out_dir, "535.183.01")`` compiles

* ``nvml.c``          -> ``<out_dir>/libnvidia-ml.so.1`` (soname ``libnvidia-ml.so.1``, the driver version
  compiled in; one build per driver version the lab packages), and
* ``uname_preload.c`` -> ``<out_dir>/libgpulab-uname.so`` (for a lab host's ``/etc/ld.so.preload``).

Plain gcc flags, so the result loads on Debian 12 (the lab hosts share the controller's glibc).
Command line: ``python3 lab/native/build.py OUT_DIR DRIVER_VERSION``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
NVML_SOURCE = SOURCE_DIR / "nvml.c"
UNAME_SOURCE = SOURCE_DIR / "uname_preload.c"
NVML_LIBRARY = "libnvidia-ml.so.1"
UNAME_LIBRARY = "libgpulab-uname.so"

COMMON_FLAGS = ("-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden")

_DRIVER_VERSION = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2})?$")


class NativeBuildError(RuntimeError):
    """The native lab libraries could not be built."""


def _compiler() -> str:
    name = os.environ.get("CC") or "gcc"
    path = shutil.which(name)
    if path is None:
        raise NativeBuildError(
            f"C compiler {name!r} not found on PATH: the lab's fake NVIDIA driver (libnvidia-ml.so.1) and "
            "uname preload are compiled from lab/native/*.c. Install gcc (apt-get install gcc) or set CC."
        )
    return path


def _compile(cc: str, args: list[str], target: Path) -> None:
    # Build next to the target, then rename: concurrent builds never see a half-written library.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        proc = subprocess.run([cc, *args, "-o", str(tmp)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise NativeBuildError(
                f"building {target.name} failed (exit {proc.returncode}):\n"
                f"  {' '.join([cc, *args])}\n{proc.stderr.strip()}"
            )
        tmp.chmod(0o755)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def build_native(out_dir: Path, driver_version: str) -> dict[str, Path]:
    """Compile both libraries into ``out_dir``; return ``{"nvml": path, "uname_preload": path}``.

    ``driver_version`` is the userspace driver version baked into libnvidia-ml (e.g. ``"535.183.01"``);
    a lab host whose ``/run/gpulab/module`` names another version gets NVML_ERROR_LIB_RM_VERSION_MISMATCH.
    """
    if not _DRIVER_VERSION.match(driver_version):
        raise NativeBuildError(f"driver version {driver_version!r} is not like '535.183.01'")
    cc = _compiler()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    nvml = out_dir / NVML_LIBRARY
    _compile(
        cc,
        [
            *COMMON_FLAGS,
            f"-Wl,-soname,{NVML_LIBRARY}",
            f'-DGPULAB_DRIVER_VERSION="{driver_version}"',
            str(NVML_SOURCE),
        ],
        nvml,
    )
    uname = out_dir / UNAME_LIBRARY
    _compile(cc, [*COMMON_FLAGS, f"-Wl,-soname,{UNAME_LIBRARY}", str(UNAME_SOURCE), "-ldl"], uname)
    return {"nvml": nvml, "uname_preload": uname}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: build.py OUT_DIR DRIVER_VERSION", file=sys.stderr)
        return 2
    try:
        built = build_native(Path(argv[0]), argv[1])
    except NativeBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    for path in built.values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
