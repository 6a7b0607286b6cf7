"""The OOM parser and its findings: every development sample of the corpus (section 1 of
tests/fixtures/corpus/field-text-dev.md, its ``Facts:`` lines read as the expected values), the grammar on generated
messages of every format, and arbitrary text (the parser never raises)."""

from __future__ import annotations

import json
import re
import subprocess
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remediation.core.parsers import detect_kind
from remediation.host.diagnose import diagnose
from remediation.train import oom
from remediation.train.api import JobFlags, diagnose_oom
from remediation.train.settings import TrainSettings
from tests.conftest import ROOT
from tests.corpus import CORPUS, blocks

UNITS = {"bytes": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def _bytes(text: str) -> int:
    number, unit = text.strip().split()
    return int((Decimal(number) * UNITS[unit]).to_integral_value())  # to the nearest byte


def _expected() -> dict[str, dict[str, object]]:
    """section -> the facts its ``Facts:`` line states, as the oom facts keys."""
    out: dict[str, dict[str, object]] = {}
    section = None
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"^### (1\.[0-9]+)\b", line)
        if heading:
            section = heading.group(1)
        elif line.startswith("## ") and not line.startswith("## 1."):
            section = None
        elif section and line.startswith("Facts:"):
            facts: dict[str, object] = {}
            body = line[len("Facts:"):].split(". Note")[0].split(". Edge")[0]
            for part in body.split(";"):
                if "=" not in part:
                    continue
                key, value = (x.strip() for x in part.split("=", 1))
                value = value.rstrip(".")
                if key == "processes":
                    m = re.search(r"in_use:\s*([0-9.]+ \w+)", value)
                    assert m
                    facts["process_bytes"] = _bytes(m.group(1))
                elif key == "gpu":
                    facts["gpu_index"] = int(value)
                elif key == "backend":
                    facts["backend"] = value
                else:
                    name = {"requested": "requested_bytes", "total": "total_bytes", "free": "free_bytes",
                            "allocated": "allocated_bytes", "reserved": "reserved_bytes",
                            "process_in_use": "process_bytes", "reserved_unallocated": "unallocated"}[key]
                    facts[name] = _bytes(value)
            if "unallocated" in facts:
                facts["reserved_bytes"] = int(facts["allocated_bytes"]) + int(facts.pop("unallocated"))  # type: ignore[call-overload]
            out[section] = facts
    return out


EXPECTED = _expected()
SECTIONS = sorted(EXPECTED, key=lambda s: int(s.split(".")[1]))


def test_every_sample_has_expectations() -> None:
    assert len(SECTIONS) >= 20
    assert set(SECTIONS) == {s for s in blocks() if s.startswith("1.")}


@pytest.mark.parametrize("section", SECTIONS)
def test_corpus_sample_facts(section: str) -> None:
    text = blocks()[section][0]
    result = diagnose(text)
    assert result.kind == "oom"
    facts = result.facts
    assert tuple(facts) == oom.FACT_KEYS  # exactly the keys, in order
    expected = dict(EXPECTED[section])
    backend = expected.pop("backend", "CUDA")
    for key, value in expected.items():
        assert facts[key] == value, (key, facts[key], value)
    for key in ("process_bytes", "reserved_bytes", "allocated_bytes", "free_bytes", "total_bytes"):
        if key not in expected:
            assert facts[key] is None, key  # null where the message does not state it
    assert facts["format"] in ("A", "B", "C", "D")
    report = oom.parse(text)
    assert report.last is not None and report.last.backend == backend
    ids = [f["id"] for f in result.to_dict()["findings"]]
    assert ids[0] == "TRAIN-OOM-001"


def test_formats_are_told_apart() -> None:
    got = {s: diagnose(blocks()[s][0]).facts["format"] for s in SECTIONS}
    assert got["1.6"] == got["1.14"] == "A"  # cached
    assert got["1.8"] == got["1.20"] == "B"  # reserved in total
    assert got["1.32"] == got["1.38"] == "C"  # total capacty (2.1)
    assert got["1.2"] == got["1.30"] == got["1.44"] == "D"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # PyTorch 0.4: the caching allocator's error, no numbers
        ("RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCCachingAllocator.cpp:510",
         {"format": "cuda-error", "requested_bytes": None}),
        ("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
         {"format": "cuda-error", "gpu_index": None}),
        # 1.x with a memory fraction set: "allowed" in the list
        ("RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 7.80 GiB total capacity; 1.22 GiB "
         "already allocated; 5.33 GiB free; 5.50 GiB allowed; 1.25 GiB reserved in total by PyTorch)",
         {"format": "B", "free_bytes": round(5.33 * 1024**3), "reserved_bytes": round(1.25 * 1024**3)}),
        # a log prefix on each wrapped line
        ("[rank0]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.15 GiB total capacity;\n"
         "[rank0]: 77.42 GiB already allocated; 1.08 GiB free; 78.50 GiB reserved in total by PyTorch)",
         {"format": "B", "gpu_index": 3, "free_bytes": round(1.08 * 1024**3)}),
        # newest: private pools (CUDA Graphs) and other processes listed
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 2 has a total capacity of "
         "79.15 GiB of which 512.00 MiB is free. Process 11 has 30.00 GiB memory in use. Including non-PyTorch "
         "memory, this process has 48.00 GiB memory in use. Of the allocated memory 45.00 GiB is allocated by "
         "PyTorch, with 4.00 GiB allocated in private pools (e.g., CUDA Graphs), and 2.00 GiB is reserved by "
         "PyTorch but unallocated.",
         {"format": "D", "gpu_index": 2, "process_bytes": 48 * 1024**3, "reserved_bytes": 47 * 1024**3}),
        # cut short by the poster
        ("torch.cuda.OutOfMemoryError: CUDA out of memory.", {"format": "unknown", "requested_bytes": None}),
        ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB.",
         {"format": "D", "requested_bytes": 20 << 20}),
        # Intel GPUs: no "of which ... free"
        ("torch.OutOfMemoryError: XPU out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.11 "
         "GiB. Of the allocated memory 12.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but "
         "unallocated.", {"format": "D", "free_bytes": None, "reserved_bytes": 13 * 1024**3}),
    ],
)
def test_other_versions_of_the_grammar(text: str, expected: dict[str, object]) -> None:
    facts = oom.facts(oom.parse(text))
    for key, value in expected.items():
        assert facts[key] == value, key
    assert detect_kind(text) == "oom"


def test_no_other_corpus_text_is_taken_for_oom() -> None:
    for section, texts in blocks().items():
        if not section.startswith("1."):
            for text in texts:
                assert detect_kind(text) != "oom", section
                assert not oom.parse(text).found, section


def test_catalog_entries() -> None:
    from remediation.core import catalog
    from remediation.core.catalog import train

    assert [e.id for e in train.ENTRIES] == [f"TRAIN-OOM-00{n}" for n in range(1, 6)]
    for entry in train.ENTRIES:
        assert catalog.get(entry.id) is entry and entry.scenario.value == "S2"
        assert all(body.strip() for _, body in entry.runbook.sections())
    book = catalog.get("TRAIN-OOM-004").runbook
    assert "gradient_accumulation_steps=4" in book.resolution and "max_seq_length" in book.prevention


# --- findings ---------------------------------------------------------------------------------------------------

D_TEMPLATE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU {gpu} has a total capacity of {total} "
    "of which {free} is free. {procs}Of the allocated memory {alloc} is allocated by PyTorch, and {unalloc} is "
    "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def _ids(text: str) -> list[str]:
    return [f.id for f in oom.findings(oom.parse(text))]


def test_fragmentation_finding() -> None:
    text = D_TEMPLATE.format(req="2.00 GiB", gpu=0, total="79.15 GiB", free="1.08 GiB", procs="",
                             alloc="60.00 GiB", unalloc="17.42 GiB")
    assert "TRAIN-OOM-002" in _ids(text)
    tight = D_TEMPLATE.format(req="2.00 GiB", gpu=0, total="79.15 GiB", free="1.08 GiB", procs="",
                              alloc="77.42 GiB", unalloc="20.00 MiB")
    assert "TRAIN-OOM-002" not in _ids(tight)
    hip = text.replace("CUDA out", "HIP out").replace("PYTORCH_CUDA", "PYTORCH_HIP")
    frag = next(f for f in oom.findings(oom.parse(hip)) if f.id == "TRAIN-OOM-002")
    assert "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True" in frag.summary


def test_other_processes_finding() -> None:
    procs = ("Including non-PyTorch memory, this process has 40.00 GiB memory in use. "
             "Process 4242 has 38.00 GiB memory in use. ")
    text = D_TEMPLATE.format(req="2.00 GiB", gpu=1, total="79.15 GiB", free="1.08 GiB", procs=procs,
                             alloc="38.00 GiB", unalloc="1.00 GiB")
    facts = oom.facts(oom.parse(text))
    assert facts["process_bytes"] == 40 * 1024**3 and facts["gpu_index"] == 1
    found = [f for f in oom.findings(oom.parse(text)) if f.id == "TRAIN-OOM-003"]
    assert found and "4242" in found[0].summary


def test_varying_steps_finding() -> None:
    one = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; " \
          "77.42 GiB already allocated; 1.08 GiB free; 78.50 GiB reserved in total by PyTorch)"
    log = f"step 512 loss 1.21\n{one}\nrestarted from checkpoint\nstep 733 loss 1.19\n{one}\n"
    report = oom.parse(log)
    assert len(report.messages) == 2 and report.steps == (512, 733)
    assert "TRAIN-OOM-004" in _ids(log)
    assert "TRAIN-OOM-004" not in _ids(one)


def test_plan_findings() -> None:
    runbook = ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; "
               "77.42 GiB already allocated; 1.08 GiB free; 78.50 GiB reserved in total by PyTorch)")
    # a 13B full fine-tune in mixed precision: the model states alone are beyond 79 GiB
    big = diagnose_oom(runbook, TrainSettings(), JobFlags(model="Llama-2-13b", regime="mixed", batch=8))
    assert [f.id for f in big.findings] == ["TRAIN-OOM-001", "TRAIN-OOM-005"]
    assert big.plan is not None and big.plan.capacity == big.facts["total_bytes"]
    # the runbook's job: LoRA on 7B, batch 8, long sequences: activations
    acts = diagnose_oom(runbook, TrainSettings(), JobFlags(model="Llama-2-7b", method="lora", batch=8,
                                                           seq_len=8192))
    finding = next(f for f in acts.findings if f.id == "TRAIN-OOM-004")
    assert "does not fit" in finding.summary and "gradient_accumulation_steps" in finding.summary
    # planned for short sequences that fit: the OOM means longer ones came
    short = diagnose_oom(runbook, TrainSettings(), JobFlags(model="Llama-2-7b", method="lora", batch=2, seq_len=512))
    finding = next(f for f in short.findings if f.id == "TRAIN-OOM-004")
    assert "sequences longer than 512 tokens" in finding.summary and "max_seq_length 512" in finding.summary


def test_diagnose_oom_task(tmp_path: object) -> None:
    from pathlib import Path

    log = Path(str(tmp_path)) / "train.log"
    log.write_text("Traceback (most recent call last):\n  ...\n" + blocks()["1.32"][0] + "\n")
    invoke = str(ROOT / ".venv" / "bin" / "invoke")
    proc = subprocess.run([invoke, "train.diagnose-oom", str(log), "--format", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "oom" and set(doc["facts"]) == set(oom.FACT_KEYS)
    assert doc["facts"]["format"] == "C" and doc["facts"]["requested_bytes"] == 3 * 1024**3
    same = subprocess.run([invoke, "diagnose", str(log), "--format", "json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert json.loads(same.stdout) == doc  # one rule per finding: both tasks say the same
    clean = Path(str(tmp_path)) / "clean.log"
    clean.write_text("step 1 loss 2.3\nstep 2 loss 2.1\n")
    proc = subprocess.run([invoke, "train.diagnose-oom", str(clean)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0 and "no PyTorch/ROCm out-of-memory message" in proc.stdout


# --- the grammar, on generated messages --------------------------------------------------------------------------


def _fmt_size(n: int) -> str:
    """PyTorch's format_size."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1024**2:
        return f"{n / 1024:.2f} KiB"
    if n <= 1024**3:
        return f"{n / 1024**2:.2f} MiB"
    return f"{n / 1024**3:.2f} GiB"


sizes = st.integers(min_value=0, max_value=300 * 1024**3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(["A", "B", "C", "D"]),
    req=sizes, total=sizes, free=sizes, alloc=sizes, cached=sizes, proc=sizes, gpu=st.integers(0, 15),
    prefix=st.sampled_from(["", "RuntimeError: ", "RuntimeError:", "torch.cuda.OutOfMemoryError: ", "why", "  \"",
                            "torch.OutOfMemoryError: "]),
    backend=st.sampled_from(["CUDA", "HIP"]), wrap=st.booleans(),
)
def test_generated_messages_round_trip(fmt: str, req: int, total: int, free: int, alloc: int, cached: int,
                                       proc: int, gpu: int, prefix: str, backend: str, wrap: bool) -> None:
    s = _fmt_size
    if fmt in ("A", "B"):
        label = "cached" if fmt == "A" else "reserved in total by PyTorch"
        text = (f"{prefix}{backend} out of memory. Tried to allocate {s(req)} (GPU {gpu}; {s(total)} total capacity; "
                f"{s(alloc)} already allocated; {s(free)} free; {s(cached)} {label})")
    else:
        capacity = "capacty" if fmt == "C" else "capacity"
        text = (f"{prefix}{backend} out of memory. Tried to allocate {s(req)}. GPU {gpu} has a total {capacity} of "
                f"{s(total)} of which {s(free)} is free. Including non-PyTorch memory, this process has {s(proc)} "
                f"memory in use. Of the allocated memory {s(alloc)} is allocated by PyTorch, and {s(cached)} is "
                "reserved by PyTorch but unallocated.")
    if wrap:
        text = text.replace("; ", ";\n", 2).replace(". Of", ".\nOf")
    facts = oom.facts(oom.parse(f"Traceback (most recent call last):\n  File x.py\n{text}\n"))
    # the oracle: each size as printed, read back to the nearest byte
    assert facts["format"] == fmt and facts["gpu_index"] == gpu
    assert facts["requested_bytes"] == _bytes(s(req)) and facts["total_bytes"] == _bytes(s(total))
    assert facts["free_bytes"] == _bytes(s(free)) and facts["allocated_bytes"] == _bytes(s(alloc))
    if fmt in ("A", "B"):
        assert facts["reserved_bytes"] == _bytes(s(cached)) and facts["process_bytes"] is None
    else:
        assert facts["reserved_bytes"] == _bytes(s(alloc)) + _bytes(s(cached))
        assert facts["process_bytes"] == _bytes(s(proc))
    assert oom.parse(text).last.backend == backend  # type: ignore[union-attr]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=3000))
def test_parser_never_raises_on_arbitrary_text(text: str) -> None:
    report = oom.parse(text)
    facts = oom.facts(report)
    assert tuple(facts) == oom.FACT_KEYS
    oom.findings(report)
    oom.score(text)


fragments = st.sampled_from([
    "CUDA out of memory.", "HIP out of memory.", "Tried to allocate", " 2.00 GiB", " (GPU 0;", " GPU 3 has a total",
    " capacity of", " capacty of", " 1.5 MiB", " of which", " is free.", "; ", " already allocated", " free",
    " reserved in total by PyTorch)", " cached)", " Process 77 has", " memory in use.", " Of the allocated memory",
    " is allocated by PyTorch, and", " is reserved by PyTorch but unallocated.", "0 bytes", "\n", " step 5 ",
    "torch.OutOfMemoryError: ", " with 1.00 GiB allocated in private pools (e.g., CUDA Graphs),", " 3.00 GiB allowed;",
    "CUDA error: out of memory", "99999999999999999999 GiB", "1,024.00 MiB", "(", ")", ";;",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(fragments, max_size=40).map("".join))
def test_parser_never_raises_on_message_like_text(text: str) -> None:
    report = oom.parse(text)
    facts = oom.facts(report)
    for key in oom.FACT_KEYS[:-1]:
        assert facts[key] is None or (isinstance(facts[key], int) and facts[key] >= 0)
    for finding in oom.findings(report):
        assert finding.evidence
