"""The repository is self-contained: no tracked file names the source-material folder beside the checkout, and the
session's open guard (tests/openguard.py, installed by tests/conftest.py) catches a test that reads outside it."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from tests.conftest import OPEN_GUARD, ROOT

# Spelled in pieces so that this file does not name them itself.
SIBLING = ".." + "/" + "shared"
SOURCE_FOLDERS = tuple("shared" + "/" + sub for sub in ("corpus", "specs", "fixtures"))


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracked_file_names_the_folder_beside_the_checkout() -> None:
    offenders = []
    for path in _tracked():
        if path.is_symlink() or not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        if SIBLING in text or any(folder in text for folder in SOURCE_FOLDERS):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == [], f"tracked files name the source-material folder beside the checkout: {offenders}"


def test_the_data_the_suite_reads_is_tracked() -> None:
    tracked = {str(p.relative_to(ROOT)) for p in _tracked()}
    for name in ("tests/fixtures/corpus/field-text-dev.md", "tests/fixtures/corpus/failedscheduling-dev.md",
                 "tests/fixtures/corpus/failedscheduling-134-135.md",
                 "tests/fixtures/corpus/memory-dev.md", "tests/fixtures/corpus/SOURCES.md",
                 "lab/services/azure-specs/SOURCES.md", "lab/services/azure-specs/LICENSE",
                 "lab/services/azure-specs/quota/resource-manager/Microsoft.Quota/stable/2023-02-01/quota.json"):
        assert name in tracked, f"{name} is not in the repository"


def test_the_open_guard_catches_a_read_beside_the_checkout() -> None:
    beside = ROOT.parent / "shared" / "corpus" / "field-text-dev.md"
    # Whether or not the folder exists on this machine, the attempt is what counts.
    with OPEN_GUARD.expected() as caught, contextlib.suppress(OSError):
        beside.read_text()
    assert str(beside) in caught


def test_the_open_guard_lets_the_checkout_and_temp_dirs_through(tmp_path: Path) -> None:
    with OPEN_GUARD.expected() as caught:
        (ROOT / "README.md").read_text()
        (tmp_path / "x").write_text("x")
    assert caught == []
    assert not OPEN_GUARD.allowed(str(ROOT.parent / "elsewhere"))
    assert OPEN_GUARD.allowed(str(Path.home() / ".ssh" / "known_hosts"))  # the user's config, read by design
    assert not OPEN_GUARD.allowed(str(Path.home() / "src" / "shared" / "corpus.md"))
    assert OPEN_GUARD.allowed(str(ROOT / "tests" / "fixtures"))
