"""The command line: the facts JSON on stdout, or the timer's output files (written atomically)."""

import argparse
import contextlib
import json
import os
import sys
import time

from .collect import collect
from .common import COMMAND_TIMEOUT_S, DEFAULT_NVML_TIMEOUT_S, PROBE_VERSION, SCHEMA, Options, _utc_iso

MYPY = False  # True for mypy only: see the package docstring
if MYPY:
    from typing import Callable, List, Optional, Tuple  # noqa: F401 - type comments

# Output file modes. The facts JSON holds kernel log lines (NVRM/Xid), which dmesg_restrict keeps from
# unprivileged users: the file is root's alone, in a directory of its own. The textfile must stay readable by
# node_exporter (often not root) and never carries kernel log text (render_textfile drops that section).
FACTS_FILE_MODE = 0o600
FACTS_DIR_MODE = 0o700
TEXTFILE_MODE = 0o644
TEXTFILE_DIR_MODE = 0o755


def write_atomic(path, text, mode=TEXTFILE_MODE, dir_mode=TEXTFILE_DIR_MODE):
    # type: (str, str, int, int) -> None
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename, so readers
    (node_exporter, the controller) see the old file or the new one, never half of one.  The temporary
    name ends in ``.tmp``: node_exporter's textfile collector reads ``*.prom`` only.

    ``mode`` is set on the temporary file before any byte is written (``mkstemp`` creates it 0600), so the text
    is never readable by more than ``mode`` allows, whatever the umask.  A missing directory is created with
    ``dir_mode``; an existing one is left as it is (the role sets its mode)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, dir_mode)
        os.chmod(directory, dir_mode)  # makedirs' mode goes through the umask
    import tempfile  # the timer's mode only

    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def build_arg_parser():
    # type: () -> argparse.ArgumentParser
    parser = argparse.ArgumentParser(prog="gpuprobe", description="Collect GPU host facts as one JSON document.")
    parser.add_argument(
        "--nvml-timeout", type=float, default=DEFAULT_NVML_TIMEOUT_S, help="seconds before the NVML child is killed"
    )
    parser.add_argument(
        "--simulate-upgrades", action="store_true", help="also run 'unattended-upgrade --dry-run -d' (slow)"
    )
    parser.add_argument("--root", default="/", help="prefix for host file paths (testing against a sample tree)")
    parser.add_argument("--kernel-release", default=None, help="override the booted kernel release (testing)")
    parser.add_argument("--skip-nvml", action="store_true", help="do not touch NVML")
    parser.add_argument("--command-timeout", type=float, default=COMMAND_TIMEOUT_S, help="seconds for apt-config/dmesg")
    parser.add_argument("--indent", type=int, default=None, help="pretty-print the JSON")
    parser.add_argument(
        "--json-out", default=None, metavar="PATH",
        help="write the facts JSON to PATH (atomically, mode 0600: it holds kernel log lines)"
    )
    parser.add_argument(
        "--prom-out", default=None, metavar="PATH",
        help="write a Prometheus textfile to PATH (atomically, mode 0644, no kernel log text)"
    )
    parser.add_argument(
        "--host-label", default=None, help="value of the metrics' host label (default: the host name)"
    )
    return parser


def main(argv=None):
    # type: (Optional[List[str]]) -> int
    args = build_arg_parser().parse_args(argv)
    options = Options(
        nvml_timeout=args.nvml_timeout,
        simulate_upgrades=args.simulate_upgrades,
        root=args.root,
        kernel_release=args.kernel_release,
        skip_nvml=args.skip_nvml,
        command_timeout=args.command_timeout,
    )
    try:
        doc = collect(options)
    except Exception as exc:  # still one JSON document, still exit 0
        doc = {
            "schema": SCHEMA,
            "probe_version": PROBE_VERSION,
            "collected_at": _utc_iso(time.time()),
            "hostname": os.uname().nodename,
            "errors": [{"section": "probe", "error": "%s: %s" % (type(exc).__name__, exc)}],
        }
    text = json.dumps(doc, indent=args.indent, sort_keys=True) + "\n"
    if not (args.json_out or args.prom_out):
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    # Output files (the timer's mode): nothing on stdout; a file that cannot be written is exit status 1.
    status = 0
    outputs = []  # type: List[Tuple[str, Callable[[], str], int, int]]
    if args.json_out:
        outputs.append((args.json_out, lambda: text, FACTS_FILE_MODE, FACTS_DIR_MODE))
    if args.prom_out:
        from .prom import render_textfile  # the timer's mode only

        outputs.append((args.prom_out, lambda: render_textfile(doc, args.host_label), TEXTFILE_MODE, TEXTFILE_DIR_MODE))
    for path, render, mode, dir_mode in outputs:
        try:
            write_atomic(path, render(), mode, dir_mode)
        except Exception as exc:
            sys.stderr.write("gpuprobe: cannot write %s: %s: %s\n" % (path, type(exc).__name__, exc))
            status = 1
    return status
