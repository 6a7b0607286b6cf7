"""Every exit code a task or ``gpufleet`` ends with, in one place, each with its one-line meaning.

The numbers are the interface (cron, CI and AWX read them), so a member's number never changes. The README's
exit-code table is rendered from this enum (:func:`markdown_table`; ``python -m remediation.core.exitcodes`` prints it)
and a unit test keeps the two the same.

``audit.unreachable_exit`` in ``invoke.yaml`` may set another number for :attr:`ExitCode.UNREACHABLE` in
``invoke audit``; every other code is fixed.
"""

from __future__ import annotations

from enum import IntEnum, unique

__all__ = ["ExitCode", "markdown_table"]


@unique
class ExitCode(IntEnum):
    """A task's exit status. An ``int``: ``Exit(code=ExitCode.FINDINGS)`` exits 1."""

    OK = 0
    FINDINGS = 1
    BAD_INPUT = 2
    UNREACHABLE = 3
    LOCK_HELD = 4
    CONTACT_SUPPORT = 5
    INTERRUPTED = 130
    BROKEN_PIPE = 141

    @property
    def meaning(self) -> str:
        """What the code tells the caller, in one line (the README's table)."""
        return _MEANINGS[self]


_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: (
        "nothing to act on: no finding, every host hardened, restored or moved (or already so), the quota granted or "
        "already sufficient, the plan fits; also `--check` and a declined prompt"
    ),
    ExitCode.FINDINGS: (
        "something to act on: a finding at or above the threshold, a host not hardened, restored or moved, a quota "
        "request `Failed`/`Invalid`, a training plan that does not fit, NVML failed on the host"
    ),
    ExitCode.BAD_INPUT: (
        "bad input, one line on stderr naming it (a flag, a config file, the inventory, the input text, no terminal "
        "to confirm on, no usable `az login`)"
    ),
    ExitCode.UNREACHABLE: (
        "could not ask: a host could not be probed and no finding reached `--fail-on` (`audit.unreachable_exit`), "
        "an ARM call failed, the Kubernetes API could not be asked"
    ),
    ExitCode.LOCK_HELD: "another driver restore or kernel update holds the fleet's lock or a host's lease",
    ExitCode.CONTACT_SUPPORT: (
        "Azure grants this quota only through a support request (`ContactSupport`, never retried)"
    ),
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C; 128 + SIGINT)",
    ExitCode.BROKEN_PIPE: "the reader closed stdout early (`head`): quiet, no traceback (128 + SIGPIPE)",
}


def markdown_table() -> str:
    """The README's exit-code table (GitHub markdown), one row per member, ending in a newline."""
    rows = ["| exit | name | meaning |", "|---:|---|---|"]
    rows.extend(f"| {int(code)} | `{code.name}` | {code.meaning} |" for code in ExitCode)
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
