"""The suite reads nothing outside the checkout: an audit hook on ``open`` records every path a test opens outside
the places it is meant to read (the checkout, the temp dirs, the lab's cache dir, the interpreter and the system's
own files), and ``tests/conftest.py`` fails the test (or the collection) that did it.

Python's ``open`` audit event fires before the file system is asked, so a path that does not exist is caught too:
a test cannot pass on one machine because a sibling folder happens to be missing on another.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The system's own files that libraries and tools read (certificates, zoneinfo, locale, passwd, /proc...).
SYSTEM_ROOTS = ("/usr", "/lib", "/lib64", "/etc", "/proc", "/sys", "/dev", "/run", "/var/lib/dpkg", "/bin", "/sbin")
#: Paths tests pass on purpose to show that nothing is there.
NOWHERE_ROOTS = ("/nonexistent", "/nonexistent-root")


def _roots(checkout: Path) -> tuple[str, ...]:
    home_cache = os.path.join(os.path.expanduser("~"), ".cache")  # pip's and hypothesis's caches
    places = {
        str(checkout),
        tempfile.gettempdir(),
        "/tmp",
        "/var/tmp",
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.base_exec_prefix,
        os.path.realpath(sys.base_prefix),
        home_cache,
        *SYSTEM_ROOTS,
        *NOWHERE_ROOTS,
    }
    cache = os.environ.get("GPULAB_CACHE_DIR")
    if cache:
        places.add(os.path.abspath(cache))
    return tuple(sorted(p.rstrip("/") + "/" for p in places if p))


class OpenGuard:
    """Records paths opened outside ``roots``; one instance is installed for the whole test session."""

    def __init__(self, checkout: Path) -> None:
        self.roots = _roots(checkout)
        self.checkout = str(checkout).rstrip("/") + "/"
        # The folder beside the checkout is never a place to read, even when the checkout was cloned into a temp
        # dir (``git clone ... $(mktemp -d)/p``): then it sits inside a temp root, which must not let it through.
        # (A checkout directly in a temp root leaves nothing to single out: the temp root stays allowed.)
        parent = os.path.dirname(str(checkout).rstrip("/")).rstrip("/") + "/"
        temp_roots = {p.rstrip("/") + "/" for p in (tempfile.gettempdir(), "/tmp", "/var/tmp")}
        self.beside = parent if parent not in temp_roots and parent.startswith(tuple(temp_roots)) else None
        self.home = os.path.expanduser("~").rstrip("/") + "/"
        self._seen: list[str] = []
        self._lock = threading.Lock()

    def allowed(self, path: str) -> bool:
        full = os.path.abspath(path) + "/"
        if self.beside is not None and full.startswith(self.beside) and not full.startswith(self.checkout):
            return False
        if full.startswith(self.roots):
            return True
        # The user's own configuration that the product reads by design, as the tools it wraps do: ~/.ssh (config,
        # known_hosts), ~/.fabric.yaml, ~/.azure, ~/.kube, ~/.ansible.cfg. A dot entry of the home directory only.
        inside = full[len(self.home):] if full.startswith(self.home) else ""
        return inside.startswith(".")

    def hook(self, event: str, args: tuple[object, ...]) -> None:
        if event != "open" or not args:
            return
        path = args[0]
        if isinstance(path, int) or path is None:
            return
        try:
            text = os.fsdecode(path)  # type: ignore[arg-type]
        except TypeError:
            return
        if not self.allowed(text):
            with self._lock:
                self._seen.append(os.path.abspath(text))

    def mark(self) -> int:
        return len(self._seen)

    def since(self, mark: int) -> list[str]:
        with self._lock:
            return list(self._seen[mark:])

    @contextmanager
    def expected(self) -> Iterator[list[str]]:
        """Opens inside the block are the test's own subject: collected into the yielded list, not held against it."""
        found: list[str] = []
        start = self.mark()
        try:
            yield found
        finally:
            with self._lock:
                found.extend(self._seen[start:])
                del self._seen[start:]


_INSTALLED: dict[str, OpenGuard] = {}


def session_guard(checkout: Path) -> OpenGuard:
    """The one guard of this process (audit hooks cannot be removed, so it is installed once however often the
    conftest module is imported)."""
    guard = _INSTALLED.get("guard")
    if guard is None:
        guard = _INSTALLED["guard"] = OpenGuard(checkout)
        sys.addaudithook(guard.hook)
    return guard
