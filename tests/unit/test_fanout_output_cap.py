"""The fan-out reads a bounded amount from one host (issue 20): more is that host's error, not memory growth.

The reader (:func:`remediation.transport.fanout.read_output`) is driven by a real local process through a small
adapter with the paramiko ``Channel`` methods it uses (no sshd): what the process writes is what a host would send.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time

import pytest

from remediation.transport.fanout import MAX_STDERR, MAX_STDOUT, MIB, OutputTooLarge, read_output


class ProcessChannel:
    """The part of paramiko's Channel that read_output uses, over a local command's pipes."""

    def __init__(self, command: str) -> None:
        self.proc = subprocess.Popen(["/bin/sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.status_event = threading.Event()
        self.closed = False
        self.read_total = 0

    def _ready(self, stream: object) -> bool:
        return bool(select.select([stream], [], [], 0)[0]) and not self._at_eof(stream)

    def _at_eof(self, stream: object) -> bool:
        return getattr(stream, "_eof", False)

    def _recv(self, stream: object, n: int) -> bytes:
        data = os.read(stream.fileno(), n)  # type: ignore[attr-defined]
        if not data:
            stream._eof = True  # type: ignore[attr-defined]
        self.read_total += len(data)
        return data

    def recv_ready(self) -> bool:
        return self._ready(self.proc.stdout)

    def recv(self, n: int) -> bytes:
        return self._recv(self.proc.stdout, n)

    def recv_stderr_ready(self) -> bool:
        return self._ready(self.proc.stderr)

    def recv_stderr(self, n: int) -> bytes:
        return self._recv(self.proc.stderr, n)

    def exit_status_ready(self) -> bool:
        return self.proc.poll() is not None

    @property
    def eof_received(self) -> bool:
        return self._at_eof(self.proc.stdout) and self._at_eof(self.proc.stderr)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def read(command: str, max_stdout: int = MAX_STDOUT, max_stderr: int = MAX_STDERR) -> tuple[ProcessChannel, object]:
    chan = ProcessChannel(command)
    try:
        return chan, read_output(chan, time.monotonic() + 60, max_stdout, max_stderr)
    except OutputTooLarge as exc:
        return chan, exc
    finally:
        chan.close()


def test_defaults_are_sane() -> None:
    assert (MAX_STDOUT, MAX_STDERR) == (16 * MIB, 1 * MIB)


def test_output_under_the_cap_is_read_whole() -> None:
    _, got = read("head -c 300000 /dev/zero; echo oops >&2", max_stdout=MIB)
    assert got == (b"\0" * 300000, b"oops\n")


@pytest.mark.parametrize(("command", "stream"), [("yes", "stdout"), ("yes >&2", "stderr")])
def test_a_host_that_never_stops_is_cut_at_the_cap(command: str, stream: str) -> None:
    chan, got = read(command, max_stdout=MIB, max_stderr=MIB // 2)
    assert isinstance(got, OutputTooLarge)
    cap = MIB if stream == "stdout" else MIB // 2
    assert str(got) == f"probe output over {cap / MIB:g} MiB on {stream} (the fan-out reads no more from one host)"
    assert chan.read_total <= cap + 1  # nothing is read past the cap


def test_exactly_the_cap_is_accepted() -> None:
    _, got = read("head -c 65536 /dev/zero", max_stdout=65536)
    assert isinstance(got, tuple) and len(got[0]) == 65536
