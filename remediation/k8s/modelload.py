"""How long a model server took to load its model, from its log (vLLM, TGI, Triton, TorchServe, Ollama).

Units matter: vLLM V0's ``Loading model weights took X GB`` is *memory*. Time comes from, per server:

- vLLM V1: ``Model loading took X GiB memory and N seconds`` (the whole load), else ``Loading weights took N
  seconds``; several loads by one worker (a drafter after the main model) add up; each tensor-parallel worker
  (``(Worker_TP0 pid=…)`` prefixes) loads in parallel, so the slowest worker counts. Without a time on the line
  (V0): the difference of the ``Starting to load model`` and ``Loading model weights took`` timestamps; else the
  elapsed time of the finished safetensors shard bar (``[mm:ss<…]``). Then the CUDA-graph capture that follows the
  load before the server takes requests (``Graph capturing finished in N secs``, V0 and V1; the slowest worker) is
  added: it is part of every cold start unless ``--enforce-eager``.
- TGI: ``Shard ready in N s`` per rank; the slowest rank; plus the weight download before it (the launcher's
  ``Downloaded /data/.../model-00001-of-00004.safetensors in 0:00:07.`` per file, one file after another: summed).
- Triton: ``loading: NAME:VERSION`` to ``successfully loaded 'NAME'`` (glog timestamps), the longest model.
- TorchServe: the worker load metric ``W-<port>-<model>.ms:N`` (milliseconds), the slowest worker.
- Ollama: ``llama runner started in N seconds``.
- Any server: ``Model loaded in N seconds`` (the runbook's line).

``load_seconds`` is None when the log holds a load start but no end, or no load at all. The parser is pure and
never raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

__all__ = ["ModelLoad", "parse", "score"]


@dataclass(frozen=True)
class ModelLoad:
    server: str | None  # vllm | tgi | triton | torchserve | ollama | None (not recognised)
    load_seconds: float | None  # the whole cold start: download + load + CUDA-graph capture, where logged
    model: str | None
    evidence: tuple[str, ...]
    download_seconds: float | None = None  # TGI's weight download (part of load_seconds)
    graph_seconds: float | None = None  # vLLM's CUDA-graph capture (part of load_seconds)

    def parts(self) -> str:
        """``download 139 s + load 47.6 s``: what load_seconds is made of, when it has more than one part."""
        if self.load_seconds is None or (self.download_seconds is None and self.graph_seconds is None):
            return ""
        core = self.load_seconds - (self.download_seconds or 0.0) - (self.graph_seconds or 0.0)
        items = [
            *([f"download {self.download_seconds:.0f} s"] if self.download_seconds is not None else []),
            f"load {core:.1f} s",
            *([f"CUDA-graph capture {self.graph_seconds:.0f} s"] if self.graph_seconds is not None else []),
        ]
        return " + ".join(items)

    def facts(self) -> dict[str, object]:
        """The ``invoke diagnose`` facts of kind ``model-load``: exactly ``load_seconds`` and ``server``."""
        return {"load_seconds": self.load_seconds, "server": self.server}


_I = re.IGNORECASE
_WORKER = re.compile(r"^\s*\((?P<worker>[^()\s]+) pid=\d+\)")
_VLLM_TS = re.compile(r"\b(?:INFO|WARNING|DEBUG|ERROR)\s+(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)\b")
_VLLM_TOTAL = re.compile(r"Model loading took\s+[\d.]+\s*\w*\s+memory and\s+(?P<s>[\d.]+)\s*s(?:ec(?:ond)?s?)?\b", _I)
_VLLM_WEIGHTS = re.compile(r"Loading weights took\s+(?P<s>[\d.]+)\s*s(?:ec(?:ond)?s?)?\b", _I)
_VLLM_START = re.compile(r"Starting to load model\s+(?P<model>\S+?)(?:\.\.\.)?\s*$", _I)
_VLLM_V0_END = re.compile(r"Loading model weights took\s+[\d.]+\s*GB", _I)
_SHARD_BAR = re.compile(r"Loading \w+ checkpoint shards:\s*100%.*?\|\s*(?P<n>\d+)/(?P=n)\s*\[(?P<el>[\d:]+)<", _I)
_TGI = re.compile(r"Shard ready in\s+(?P<s>[\d.]+)\s*(?P<unit>ms|s)\b", _I)
# TGI's download_weights (server/text_generation_server/utils/hub.py): "Downloaded {file} in {timedelta}." per file
_TGI_DOWNLOADED = re.compile(
    r"\bDownloaded\s+\S+\s+in\s+(?:(?P<d>\d+) days?, )?(?P<clock>\d+:\d\d:\d\d(?:\.\d+)?)\.?", _I
)
# vLLM V0 model_runner.py / V1 gpu_model_runner.py: "Graph capturing finished in 14 secs[, took 0.53 GiB]"
_VLLM_GRAPH = re.compile(r"Graph capturing finished in\s+(?P<s>[\d.]+)\s*s(?:ec(?:ond)?s?)?\b", _I)
_TRITON_TS = re.compile(r"^[IWE](?P<md>\d{4}) (?P<t>\d\d:\d\d:\d\d(?:\.\d+)?)\s+\d+\s+\S+\]")
_TRITON_START = re.compile(r"\]\s*loading:\s*(?P<model>[^:\s]+)(?::(?P<version>\d+))?", _I)
_TRITON_END = re.compile(r"successfully loaded '(?P<model>[^']+)'", _I)
_TORCHSERVE = re.compile(r"\bW-\d+-(?P<model>\S{1,256}?)\.ms:(?P<ms>\d+)\|", _I)
_OLLAMA = re.compile(r"llama runner started in\s+(?P<s>[\d.]+)\s*(?:s|sec|seconds)\b", _I)
_GENERIC = re.compile(
    r"\bmodel (?:loaded|load(?:ing)? (?:took|finished|completed))(?: in)?\s+(?P<s>[\d.]+)\s*"
    r"(?P<unit>ms|s|sec|secs|seconds)\b",
    _I,
)

_MARKERS: tuple[tuple[str, re.Pattern[str], int], ...] = (
    (
        "vllm",
        re.compile(
            r"Model loading took|Loading weights took|Loading model weights took|Starting to load model"
            r"|checkpoint shards:|Graph capturing finished|model_runner\.py|gpu_executor\.py|vllm",
            _I,
        ),
        4,
    ),
    ("tgi", re.compile(r"Shard ready in|text_generation_launcher|text-generation-launcher|shard-manager", _I), 5),
    (
        "triton",
        re.compile(r"model_lifecycle\.cc|model_repository_manager\.cc|successfully loaded '|tritonserver", _I),
        5,
    ),
    ("torchserve", re.compile(r"WORKER_MODEL_LOADED|TS_METRICS|org\.pytorch\.serve|W-\d+-\S{1,256}?\.ms:\d+", _I), 5),
    ("ollama", re.compile(r"llama runner started|starting llama server|ollama|llm_load_tensors", _I), 5),
)


def score(text: str) -> int:
    """How much ``text`` looks like a model server's load log (for ``invoke diagnose`` kind detection)."""
    if not isinstance(text, str):
        return 0
    total = 0
    for _server, pattern, weight in _MARKERS:
        total += weight * min(3, len(pattern.findall(text)))
    if _GENERIC.search(text):
        total += 8
    return total


def _float(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _clock(value: str) -> float:
    seconds = 0.0
    for part in value.split(":"):
        seconds = seconds * 60 + (_float(part) or 0.0)
    return seconds


def _vllm_time(ts: str) -> datetime | None:
    try:
        return datetime.strptime("2000-" + ts, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None


def _vllm(lines: list[str]) -> tuple[float | None, str | None, list[str]]:
    per_worker_total: dict[str, float] = {}
    per_worker_weights: dict[str, float] = {}
    starts: dict[str, datetime] = {}
    spans: dict[str, float] = {}
    evidence: list[str] = []
    model: str | None = None
    bars: list[float] = []
    for line in lines:
        w = _WORKER.match(line)
        worker = w.group("worker") if w else ""
        ts_match = _VLLM_TS.search(line)
        ts = _vllm_time(ts_match.group("ts")) if ts_match else None
        if (m := _VLLM_TOTAL.search(line)) and (s := _float(m.group("s"))) is not None:
            per_worker_total[worker] = per_worker_total.get(worker, 0.0) + s
            evidence.append(line.strip())
        elif (m := _VLLM_WEIGHTS.search(line)) and (s := _float(m.group("s"))) is not None:
            per_worker_weights[worker] = per_worker_weights.get(worker, 0.0) + s
            evidence.append(line.strip())
        elif m := _VLLM_START.search(line):
            model = model or m.group("model").rstrip(".")
            if ts is not None:
                starts[worker] = ts
            evidence.append(line.strip())
        elif _VLLM_V0_END.search(line):
            evidence.append(line.strip())
            if ts is not None and worker in starts:
                delta = (ts - starts.pop(worker)).total_seconds()
                spans[worker] = spans.get(worker, 0.0) + (delta if delta >= 0 else delta + 86400)
        elif m := _SHARD_BAR.search(line):
            bars.append(_clock(m.group("el")))
            evidence.append(line.strip())
    for table in (per_worker_total, per_worker_weights, spans):
        if table:
            return max(table.values()), model, evidence
    if bars:
        return max(bars), model, evidence
    return None, model, evidence


def _vllm_graph(lines: list[str]) -> tuple[float | None, list[str]]:
    """The CUDA-graph capture after the load: the slowest worker's (workers capture in parallel)."""
    per_worker: dict[str, float] = {}
    evidence: list[str] = []
    for line in lines:
        if (m := _VLLM_GRAPH.search(line)) and (s := _float(m.group("s"))) is not None:
            w = _WORKER.match(line)
            worker = w.group("worker") if w else ""
            per_worker[worker] = per_worker.get(worker, 0.0) + s
            evidence.append(line.strip())
    return (max(per_worker.values()) if per_worker else None), evidence


def _tgi_download(lines: list[str]) -> tuple[float | None, list[str]]:
    """TGI's weight download: the files are fetched one after another, so their times add up."""
    total: float | None = None
    evidence: list[str] = []
    for line in lines:
        if m := _TGI_DOWNLOADED.search(line):
            days = int(m.group("d")) if m.group("d") else 0
            total = (total or 0.0) + days * 86400 + _clock(m.group("clock"))
            evidence.append(line.strip())
    return total, evidence


def _triton_time(md: str, t: str) -> datetime | None:
    try:
        return datetime.strptime(f"2000{md} {t}", "%Y%m%d %H:%M:%S.%f" if "." in t else "%Y%m%d %H:%M:%S")
    except ValueError:
        return None


def _triton(lines: list[str]) -> tuple[float | None, str | None, list[str]]:
    starts: dict[str, datetime] = {}
    loads: list[float] = []
    evidence: list[str] = []
    model: str | None = None
    for line in lines:
        ts_match = _TRITON_TS.match(line.strip())
        ts = _triton_time(ts_match.group("md"), ts_match.group("t")) if ts_match else None
        if m := _TRITON_START.search(line):
            model = model or m.group("model")
            evidence.append(line.strip())
            if ts is not None:
                starts[m.group("model")] = ts
        elif m := _TRITON_END.search(line):
            evidence.append(line.strip())
            begin = starts.pop(m.group("model"), None)
            if ts is not None and begin is not None:
                delta = (ts - begin).total_seconds()
                loads.append(delta if delta >= 0 else delta + 86400)
    return (max(loads) if loads else None), model, evidence


def parse(text: str) -> ModelLoad:
    """The server and its model load time in ``text`` (see the module docstring). Never raises."""
    if not isinstance(text, str) or not text.strip():
        return ModelLoad(None, None, None, ())
    lines = text.splitlines()
    counts = {server: len(pattern.findall(text)) for server, pattern, _w in _MARKERS}
    tgi = [(m, line) for line in lines if (m := _TGI.search(line))]
    torchserve = [(m, line) for line in lines if (m := _TORCHSERVE.search(line))]
    ollama = [(m, line) for line in lines if (m := _OLLAMA.search(line))]
    if tgi:
        values = [(_float(m.group("s")) or 0.0) / (1000 if m.group("unit").lower() == "ms" else 1) for m, _ in tgi]
        download, fetched = _tgi_download(lines)
        return ModelLoad(
            "tgi",
            max(values) + (download or 0.0),
            None,
            (*fetched, *(line.strip() for _, line in tgi)),
            download_seconds=download,
        )
    if torchserve:
        values = [int(m.group("ms")) / 1000 for m, _ in torchserve]
        return ModelLoad(
            "torchserve", max(values), torchserve[0][0].group("model"), tuple(line.strip() for _, line in torchserve)
        )
    if ollama:
        return ModelLoad(
            "ollama",
            max(_float(m.group("s")) or 0.0 for m, _ in ollama),
            None,
            tuple(line.strip() for _, line in ollama),
        )
    if counts["triton"] and (_TRITON_START.search(text) or _TRITON_END.search(text)):
        seconds, model, evidence = _triton(lines)
        return ModelLoad("triton", seconds, model, tuple(evidence))
    if counts["vllm"]:
        seconds, model, evidence = _vllm(lines)
        graph, captured = _vllm_graph(lines)
        if seconds is not None and graph is not None:
            return ModelLoad("vllm", seconds + graph, model, (*evidence, *captured), graph_seconds=graph)
        if seconds is not None or evidence:
            return ModelLoad("vllm", seconds, model, tuple(evidence))
    generic = [(m, line) for line in lines if (m := _GENERIC.search(line))]
    if generic:
        values = [(_float(m.group("s")) or 0.0) / (1000 if m.group("unit").lower() == "ms" else 1) for m, _ in generic]
        server = max(counts, key=lambda k: counts[k]) if any(counts.values()) else None
        return ModelLoad(server, max(values), None, tuple(line.strip() for _, line in generic))
    server = max(counts, key=lambda k: counts[k]) if any(counts.values()) else None
    return ModelLoad(server, None, None, ())
