"""The cordon marker on one GPU host, set and removed by ``invoke remediate``. Runs ON the host.

Sent over SSH on stdin (``python3 - REQUEST``, REQUEST = base64 of a JSON object) by
:mod:`remediation.remediate.cordon`; standard library only, Python 3.8 syntax, like the lease program. No value of
the request ever becomes shell text: the controller sends data, this program writes it.

The marker is ``/etc/gpufleet/cordoned`` (:data:`remediation.rollout.cordon.CORDON_MARKER`). A person writes any
text there; the loop writes one line of JSON: ``owner`` (``gpufleet-remediate``), ``run_id``, ``reason``,
``findings``, ``at`` (UTC, ISO 8601), ``controller`` (who, why, when: what NVSentinel records as node labels and
annotations).

Operations (``op`` in the request):
- ``cordon``: no marker -> the request's ``record`` is written (to a temporary file, then hard-linked to the
  marker's name, which fails when a marker appeared meanwhile: "absent? then mine" is one atomic step) -> ``set``;
  a marker already there -> ``held`` with its text (first 400 characters). Nothing is written then.
- ``uncordon``: the marker is removed only when its JSON names ``owner`` and ``run_id`` of the request
  (``removed``); ``absent``; ``not-ours`` with its text otherwise.

Prints one JSON object on stdout; a marker directory that cannot be created or written (a non-root user without
``sudo``) is ``{"result": "error", "error": ...}``, not a traceback.
"""

import base64
import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional  # noqa: F401 - used in type comments (3.8)

MARKER = "/etc/gpufleet/cordoned"
SHOWN = 400


def _read(path):
    # type: (str) -> Optional[str]
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(SHOWN)
    except FileNotFoundError:
        return None


def _record(text):
    # type: (Optional[str]) -> Optional[Dict[str, Any]]
    if not text:
        return None
    try:
        doc = json.loads(text.strip().splitlines()[0])
    except (ValueError, IndexError):
        return None
    return doc if isinstance(doc, dict) else None


def cordon(path, record):
    # type: (str, Dict[str, Any]) -> Dict[str, Any]
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".cordoned.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return {"result": "held", "text": _read(path) or ""}
    finally:
        os.unlink(tmp)
    return {"result": "set"}


def uncordon(path, owner, run_id):
    # type: (str, str, str) -> Dict[str, Any]
    text = _read(path)
    if text is None:
        return {"result": "absent"}
    doc = _record(text)
    if doc is None or doc.get("owner") != owner or doc.get("run_id") != run_id:
        return {"result": "not-ours", "text": text}
    os.unlink(path)
    return {"result": "removed"}


def main(argv):
    # type: (List[str]) -> int
    try:
        request = json.loads(base64.b64decode(argv[0]).decode("utf-8"))
        op = request["op"]
        path = request.get("path") or MARKER
        if op == "cordon":
            answer = cordon(path, dict(request["record"]))
        elif op == "uncordon":
            answer = uncordon(path, str(request["owner"]), str(request["run_id"]))
        else:
            answer = {"result": "error", "error": "unknown op %r" % (op,)}
    except (IndexError, KeyError, ValueError, TypeError) as exc:
        answer = {"result": "error", "error": "bad request: %s" % (exc,)}
    except OSError as exc:
        answer = {"result": "error", "error": "%s (uid %d): run as root or through sudo" % (exc, os.getuid())}
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
