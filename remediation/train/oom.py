"""PyTorch / ROCm out-of-memory messages: the parser, the facts, and the findings drawn from them.

The grammar (PyTorch's caching allocator, ``c10/cuda/CUDACachingAllocator.cpp``, by release):

- **A** (<= 1.4): ``Tried to allocate X (GPU g; T total capacity; A already allocated; F free; C cached)``;
  ``cached`` is what later releases call reserved.
- **B** (1.5 - 2.0): the same parenthesised list ending ``R reserved in total by PyTorch``; ``S allowed`` appears
  when a memory fraction is set; the closing parenthesis may be lost to copy and paste.
- **C** (2.1, ``capacty``) and **D** (2.2+): sentences. ``Tried to allocate X. GPU g has a total capacity of T of
  which F is free.`` then one ``Including non-PyTorch memory, this process has P memory in use.`` and a ``Process N
  has P memory in use.`` per other process NVML sees, maybe ``S allowed;``, then ``Of the allocated memory A is
  allocated by PyTorch, [with Q allocated in private pools (e.g., CUDA Graphs), ]and U is reserved by PyTorch but
  unallocated.`` Reserved in total is ``A + U``.
- ROCm builds say ``HIP out of memory`` (and ``PYTORCH_HIP_ALLOC_CONF``) with the format-D body.
- ``CUDA error: out of memory`` (a CUDA call, not the allocator) carries no numbers: format ``cuda-error``; a
  message cut short after its head is ``unknown`` (or ``B``/``D`` when what follows the request shows which).

Sizes are PyTorch's ``format_size``: ``N bytes``, ``X KiB``, ``X MiB``, ``X GiB`` (two decimals), read here to
bytes. The message may sit in a traceback, in prose, in quotes, be glued to a word or wrapped over lines; whitespace is
normalised before matching. The parser never raises; text with no OOM message gives ``found=False``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from remediation.core.findings import Finding, make_finding

if TYPE_CHECKING:
    from remediation.train.plan import Plan

__all__ = ["FACT_KEYS", "OomMessage", "OomReport", "facts", "findings", "parse", "score"]

GiB = 1024**3
MiB = 1024**2

#: The facts of kind ``oom``, exactly (bytes; null where the message does not state it).
FACT_KEYS = (
    "requested_bytes",
    "gpu_index",
    "total_bytes",
    "free_bytes",
    "allocated_bytes",
    "reserved_bytes",
    "process_bytes",
    "format",
)

_UNIT = {"bytes": 1, "byte": 1, "b": 1, "kib": 1024, "mib": MiB, "gib": GiB, "tib": 1024**4,
         "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
_SIZE = r"(?<![0-9,])([0-9][0-9,]*(?:\.[0-9]+)?)\s*(bytes?|[KMGT]i?B|B)\b"
_SIZE_RE = re.compile(_SIZE, re.I)

_HEAD = re.compile(r"(CUDA|HIP|XPU) out of memory", re.I)
_TRIED = re.compile(r"Tried to allocate\s+" + _SIZE, re.I)
# (?<!\s) before each lookahead: its \s+ is tried once per run of spaces, not at every space (linear).
_PAREN = re.compile(
    r"\(\s*GPU\s*([0-9]+)\s*;([^()]*?)(?:\)|(?<!\s)(?=\s+If reserved)|(?<!\s)(?=\s+See documentation)|$)", re.I
)
_CAPACITY = re.compile(
    r"GPU\s*([0-9]+)\s+has a total capac(?:i)?ty of\s+" + _SIZE + r"(?:\s+of which\s+" + _SIZE + r"\s+(?:is\s+)?free)?",
    re.I,
)
_THIS_PROCESS = re.compile(r"this process has\s+" + _SIZE + r"\s+memory in use", re.I)
_OTHER_PROCESS = re.compile(r"Process\s+([0-9]+)\s+has\s+" + _SIZE + r"\s+memory in use", re.I)
_ALLOCATED = re.compile(r"Of the allocated memory\s+" + _SIZE + r"\s+is allocated by PyTorch", re.I)
_UNALLOCATED = re.compile(_SIZE + r"\s+is reserved by PyTorch but unallocated", re.I)
_PRIVATE = re.compile(r"with\s+" + _SIZE + r"\s+allocated in private pools", re.I)
_ALLOWED = re.compile(_SIZE + r"\s+allowed", re.I)
_CUDA_ERROR = re.compile(r"(?:(CUDA|HIP) error:\s*|cuda runtime error \(2\)\s*:\s*)out of memory", re.I)
_STEP = re.compile(
    r"(?:\b(?:global[_ ]?)?step\b\s*[:=#]?\s*|\biter(?:ation)?\s*[:=#]?\s*|\|\s*)([0-9]{1,9})(?:\s*/\s*[0-9]+)?", re.I
)
_WS = re.compile(r"\s+")


def _bytes(number: str, unit: str) -> int | None:
    try:
        value = Decimal(number.replace(",", ""))
    except InvalidOperation:
        return None
    factor = _UNIT.get(unit.lower())
    if factor is None:
        return None
    return int((value * factor).to_integral_value())


def _size(match: re.Match[str] | None, group: int = 1) -> int | None:
    if match is None or match.group(group) is None:
        return None
    return _bytes(match.group(group), match.group(group + 1))


@dataclass(frozen=True)
class OomMessage:
    """One out-of-memory message, its sizes in bytes (None where the message does not state them)."""

    format: str  # A | B | C | D | cuda-error | unknown (a head with nothing after it)
    backend: str  # CUDA | HIP
    requested: int | None
    gpu: int | None
    total: int | None
    free: int | None
    allocated: int | None
    reserved: int | None  # total reserved by PyTorch (A: cached; C/D: allocated + reserved-but-unallocated)
    process: int | None  # this process's memory in use as NVML sees it, where printed
    other_processes: tuple[tuple[int, int | None], ...]  # (pid, bytes) of "Process N has ..." lines
    allowed: int | None
    evidence: tuple[str, ...]
    step: int | None  # the training step last mentioned before the message, if any

    @property
    def unallocated(self) -> int | None:
        """Reserved by PyTorch but not allocated (the allocator's cache, where fragmentation lives)."""
        if self.reserved is None or self.allocated is None:
            return None
        return max(0, self.reserved - self.allocated)


@dataclass(frozen=True)
class OomReport:
    """Every OOM message found in a piece of text, oldest first."""

    messages: tuple[OomMessage, ...]

    @property
    def found(self) -> bool:
        return bool(self.messages)

    @property
    def last(self) -> OomMessage | None:
        return self.messages[-1] if self.messages else None

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(m.step for m in self.messages if m.step is not None))


def score(text: str) -> int:
    """How much ``text`` looks like an OOM report (0: not at all); for ``invoke diagnose``'s kind detection."""
    total = 0
    if _HEAD.search(text) or _CUDA_ERROR.search(text):
        total += 10
    if _TRIED.search(text):
        total += 10
    if re.search(r"OutOfMemoryError", text):
        total += 5
    if re.search(r"total capac(?:i)?ty|reserved in total by PyTorch|reserved by PyTorch but unallocated", text, re.I):
        total += 5
    return total


def _starts(text: str) -> list[int]:
    """Where each message starts: its head (``CUDA out of memory``) or, for fragments, ``Tried to allocate``."""
    starts: list[int] = []
    for m in re.finditer(
        r"(?:CUDA|HIP|XPU) out of memory|Tried to allocate|(?:CUDA|HIP) error:\s*out of memory"
        r"|cuda runtime error \(2\)\s*:\s*out of memory",
        text,
        re.I,
    ):
        if m.group(0).lower().startswith("tried") and starts and _between_is_head(text, starts[-1], m.start()):
            continue  # the "Tried to allocate" of a message whose head was already seen
        starts.append(m.start())
    return starts


def _between_is_head(text: str, start: int, pos: int) -> bool:
    return pos - start < 200 and bool(_HEAD.match(text, start)) and "Tried to allocate" not in text[start:pos]


def parse(text: str) -> OomReport:
    """Every OOM message in ``text``. Never raises."""
    try:
        return _parse(text)
    except Exception:  # a parser of field text never takes the triage down
        return OomReport(())


def _parse(text: str) -> OomReport:
    flat = _WS.sub(" ", text)
    starts = _starts(flat)
    messages: list[OomMessage] = []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(flat)
        body = flat[start:end]
        head = flat[max(0, start - 40) : start + 20]
        named = re.search(r"(HIP|XPU) (?:out of memory|error)", head + body[:40], re.I)
        backend = named.group(1).upper() if named else "CUDA"
        if "HIP_ALLOC_CONF" in body:
            backend = "HIP"
        step = None
        for sm in _STEP.finditer(flat[max(0, start - 2000) : start]):
            step = int(sm.group(1))
        evidence = _evidence(text, body)
        if _CUDA_ERROR.match(body):
            messages.append(OomMessage("cuda-error", backend, None, None, None, None, None, None, None, (), None,
                                       evidence, step))
            continue
        requested = _size(_TRIED.search(body))
        cap = _CAPACITY.search(body)
        paren = _PAREN.search(body)
        if cap is not None:
            fmt = "D" if re.search(r"total capacity", body, re.I) else "C"
            allocated = _size(_ALLOCATED.search(body))
            unalloc = _size(_UNALLOCATED.search(body))
            reserved = allocated + unalloc if allocated is not None and unalloc is not None else None
            this = _size(_THIS_PROCESS.search(body))
            others = tuple((int(m.group(1)), _bytes(m.group(2), m.group(3))) for m in _OTHER_PROCESS.finditer(body))
            process = this if this is not None else (others[0][1] if len(others) == 1 else None)
            if this is None and len(others) == 1:
                others = ()  # "Process N has ...": in a container NVML's pid is not the process's own
            messages.append(
                OomMessage(fmt, backend, requested, int(cap.group(1)), _size(cap, 2), _size(cap, 4), allocated,
                           reserved, process, others, _size(_ALLOWED.search(body)), evidence, step)
            )
        elif paren is not None:
            items = _items(paren.group(2))
            fmt = "A" if "cached" in items else "B"
            reserved = items.get("reserved in total by pytorch", items.get("cached"))
            messages.append(
                OomMessage(fmt, backend, requested, int(paren.group(1)), items.get("total capacity"),
                           items.get("free"), items.get("already allocated"), reserved, None, (),
                           items.get("allowed"), evidence, step)
            )
        elif _HEAD.search(body) or requested is not None:
            # a message cut short: "Tried to allocate X." starts the 2.1+ sentences, "X (GPU" the older list
            tried = _TRIED.search(body)
            after = body[tried.end() : tried.end() + 3] if tried else ""
            fmt = "D" if after.startswith(".") else "B" if after.lstrip().startswith("(") else "unknown"
            messages.append(OomMessage(fmt, backend, requested, None, None, None, None, None, None, (), None,
                                       evidence, step))
    return OomReport(tuple(messages))


def _items(body: str) -> dict[str, int | None]:
    """``10.91 GiB total capacity; 9.18 GiB already allocated; ...`` -> {label: bytes}."""
    out: dict[str, int | None] = {}
    for part in body.split(";"):
        # the last size in the part and the words after it (a log prefix wrapped into the list is skipped)
        m = re.search(_SIZE + r"\s+([A-Za-z][A-Za-z ]*?)\s*$", part, re.I)
        if m:
            label = re.sub(r"\s+", " ", m.group(3)).strip().lower()
            out[label] = _bytes(m.group(1), m.group(2))
    return out


def _evidence(text: str, body: str) -> tuple[str, ...]:
    """The original lines that carry this message (for findings)."""
    key = body[:60].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        flat = _WS.sub(" ", line)
        if key[:30] and key[:30] in flat:
            picked = [line]
            # a message wrapped over lines: keep the continuation lines up to the closing part
            j = i + 1
            while j < len(lines) and j < i + 4 and not re.search(r"\)|unallocated|PyTorch\s*$", " ".join(picked)):
                picked.append(lines[j])
                j += 1
            return tuple(_clip(p) for p in picked)
    return (_clip(body),)


def _clip(line: str, limit: int = 600) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


def facts(report: OomReport) -> dict[str, Any]:
    """The ``oom`` facts: exactly :data:`FACT_KEYS`, from the last message (null where not stated)."""
    m = report.last
    if m is None:
        return dict.fromkeys(FACT_KEYS)
    return {
        "requested_bytes": m.requested,
        "gpu_index": m.gpu,
        "total_bytes": m.total,
        "free_bytes": m.free,
        "allocated_bytes": m.allocated,
        "reserved_bytes": m.reserved,
        "process_bytes": m.process,
        "format": m.format,
    }


# --- findings (one rule per ID; used by train.diagnose-oom and by invoke diagnose) ---------------------------------


def _fmt(value: int | None) -> str:
    if value is None:
        return "?"
    if value >= GiB:
        return f"{value / GiB:.2f} GiB"
    return f"{value / MiB:.2f} MiB"


#: Memory outside PyTorch's allocator that the CUDA context of the failing process itself may account for.
CONTEXT_ALLOWANCE = GiB


def other_process_bytes(m: OomMessage) -> int | None:
    """GPU memory held outside this process's PyTorch allocator, beyond a CUDA context's share; None if unknown."""
    if m.total is None or m.free is None:
        return None
    if m.process is not None:
        return max(0, m.total - m.free - m.process)
    if m.reserved is None:
        return None
    return max(0, m.total - m.free - m.reserved - min(CONTEXT_ALLOWANCE, m.total // 4))


def findings(report: OomReport, plan: Plan | None = None) -> list[Finding]:
    """Findings of an OOM report; with ``plan`` (the job as planned) the planner's numbers name the cause.

    One function per finding ID (the OOM itself, fragmentation, other processes, activations, model states)."""
    m = report.last
    if m is None:
        return []
    return [
        *oom_finding(report, m),
        *fragmentation(m),
        *other_processes(m),
        *activations(report, m, plan),
        *model_states(m, plan),
    ]


def oom_finding(report: OomReport, m: OomMessage) -> list[Finding]:
    """TRAIN-OOM-001: the OOM itself, with what the message states."""
    where = f"GPU {m.gpu}" if m.gpu is not None else "the GPU"
    summary = f"{m.backend} out of memory on {where}: tried to allocate {_fmt(m.requested)}"
    if m.total is not None:
        summary += f" of {_fmt(m.total)} total, {_fmt(m.free)} free"
    if m.allocated is not None:
        summary += f"; PyTorch allocated {_fmt(m.allocated)}, reserved {_fmt(m.reserved)}"
    if len(report.messages) > 1:
        summary += f" ({len(report.messages)} OOMs in the text)"
    if m.requested is not None and m.total is not None and m.requested > m.total:
        summary += "; the request alone is larger than the GPU"
    return [make_finding("TRAIN-OOM-001", summary, m.evidence)]


def fragmentation(m: OomMessage) -> list[Finding]:
    """TRAIN-OOM-002: the allocator's cache held at least the request, or a large share of what it reserved and,
    with the free memory, enough for the request; but not in one piece."""
    unalloc = m.unallocated
    reserved = m.reserved or 0
    if not (
        unalloc is not None
        and m.requested is not None
        and unalloc > 0
        and (unalloc >= m.requested or (unalloc >= 0.2 * reserved and unalloc + (m.free or 0) >= m.requested))
    ):
        return []
    conf = "PYTORCH_HIP_ALLOC_CONF" if m.backend == "HIP" else "PYTORCH_CUDA_ALLOC_CONF"
    return [
        make_finding(
            "TRAIN-OOM-002",
            f"fragmentation: {_fmt(unalloc)} reserved by PyTorch but unallocated could have served the "
            f"{_fmt(m.requested)} request; set {conf}=expandable_segments:True",
            m.evidence,
        )
    ]


def other_processes(m: OomMessage) -> list[Finding]:
    """TRAIN-OOM-003: other processes (or memory outside this process's allocator) hold a share of the GPU."""
    other = other_process_bytes(m)
    listed = [pid for pid, _ in m.other_processes]
    if not (listed or (other is not None and m.total is not None and other >= max(GiB, m.total // 10))):
        return []
    where = f"GPU {m.gpu}" if m.gpu is not None else "the GPU"
    who = f"processes {', '.join(map(str, listed))} hold GPU memory" if listed else "memory outside this process"
    return [
        make_finding(
            "TRAIN-OOM-003",
            f"{who}: about {_fmt(other)} of {where} is used outside this process's PyTorch allocator",
            m.evidence,
        )
    ]


def _states_too_big(m: OomMessage, plan: Plan) -> tuple[int, Plan] | None:
    """(the GPU's capacity, the job at a single token) when what no batch or sequence setting changes does not fit:
    the planned model states (parameters, gradients, optimizer states) with the optimizer step's temporaries, the
    allocator's reserve and the CUDA context, at batch 1 and one token with gradient checkpointing (the planner's
    floor, as ``train.plan`` reports it). Else None."""
    from remediation.train.plan import single_token_floor

    cap = m.total or plan.capacity
    if cap is None:
        return None
    floor = single_token_floor(plan.input)
    return (cap, floor) if floor.peak_bytes > cap else None


def activations(report: OomReport, m: OomMessage, plan: Plan | None) -> list[Finding]:
    """TRAIN-OOM-004: activations from long sequences: OOMs at varying steps, or (with the plan) an OOM the plan
    says the settings fit, or settings the plan says do not fit (with the settings that do)."""
    steps = report.steps
    if len(steps) >= 2:
        return [
            make_finding(
                "TRAIN-OOM-004",
                f"OOM at varying steps ({', '.join(map(str, steps))}): longer sequences arrived; set max_seq_length "
                "and pad/truncate",
                tuple(line for msg in report.messages for line in msg.evidence),
            )
        ]
    if plan is None or _states_too_big(m, plan) is not None:
        return []
    from remediation.train.plan import recommend

    b = plan.breakdown
    acts = b["activations"] + b["logits"]
    detail = (
        f"planned: activations + logits {_fmt(acts)} at batch {plan.input.batch} x {plan.input.seq_len} tokens, "
        f"peak {_fmt(plan.peak_bytes)}"
    )
    rec = recommend(plan.input)
    if plan.fits:
        ceiling = rec.max_seq_length_ceiling
        longest = f"; up to {ceiling} tokens fit with these settings" if ceiling else ""
        summary = (
            f"activations: the plan fits ({detail}), so sequences longer than {plan.input.seq_len} tokens "
            f"reached the GPU: set max_seq_length {plan.input.seq_len} and pad/truncate{longest}"
        )
    else:
        fix = (
            f"max_seq_length {rec.max_seq_length}, per_device_train_batch_size {rec.per_device_train_batch_size}, "
            f"gradient_accumulation_steps {rec.gradient_accumulation_steps}"
            + (", gradient checkpointing" if rec.gradient_checkpointing else "")
            + (f", {rec.method}" if rec.method != plan.input.method else "")
        )
        summary = f"activations: the plan does not fit ({detail}); fits with {fix}"
    return [make_finding("TRAIN-OOM-004", summary, m.evidence)]


def model_states(m: OomMessage, plan: Plan | None) -> list[Finding]:
    """TRAIN-OOM-005: the planned model states (with the optimizer step's temporaries) do not fit the GPU at any
    batch or sequence length."""
    if plan is None:
        return []
    too_big = _states_too_big(m, plan)
    if too_big is None:
        return []
    cap, floor = too_big
    b = plan.breakdown
    step = plan.transients["optimizer_step"]
    return [
        make_finding(
            "TRAIN-OOM-005",
            f"model states need {_fmt(plan.model_states)} (parameters {_fmt(b['parameters'])}, gradients "
            f"{_fmt(b['gradients'])}, optimizer states {_fmt(b['optimizer_states'])}, {plan.input.regime})"
            + (f", the optimizer step {_fmt(step)} more" if step else "")
            + f": {_fmt(floor.peak_bytes)} at batch 1 with one token, on a {_fmt(cap)} GPU; no batch or sequence "
            "length fits: use LoRA/QLoRA, ZeRO across GPUs or a bigger GPU",
            m.evidence,
        )
    ]
