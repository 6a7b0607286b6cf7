"""The rollout lease on one GPU host: who is changing this host now, until when. Runs ON the host.

Sent over SSH on stdin (``python3 - REQUEST``, REQUEST = base64 of a JSON object) by
:func:`remediation.rollout.lock.host_leases` and by the ``rollout_lease`` role (a playbook run directly); standard
library only, Python 3.8 syntax, like the probe.

The lease is ``/var/lib/gpufleet/rollout.lease`` (JSON: change kind, run id, controller, user, pid, fleet, acquired
and expiry times in the host's own clock). Every controller that changes this host (driver restore, kernel update)
reads and writes it under an exclusive ``flock`` of ``/var/lib/gpufleet/rollout.lease.guard``, so "is it free or
stale? then it is mine" is one atomic step on the host, whichever controller, clone or ``ansible-playbook`` run asks.
The new content is written to a temporary file and renamed over the lease, so a reader never sees half a lease.

Operations (``op`` in the request):
- ``acquire``: free, or held by the same run, or expired, or held by the run named ``stale_run_id`` (its controller
  found that run's process dead on its own machine) -> ours (``acquired`` / ``renewed`` / ``took-over`` with
  the stale holder); held by another run that has not expired -> ``held`` with the holder. Nothing is written then.
- ``release``: removed when it is ours (``released``); ``not-ours`` / ``absent`` otherwise.
- ``read``: the current holder, if any, and whether it has expired.

Prints one JSON object on stdout; a lease directory or guard that cannot be created (a non-root user without
``sudo``) is ``{"result": "error", "error": ...}`` naming the uid and the fix, not a traceback.
"""

import base64
import fcntl
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional  # noqa: F401 - used in type comments (3.8)

LEASE_DIR = "/var/lib/gpufleet"
LEASE = LEASE_DIR + "/rollout.lease"
GUARD = LEASE + ".guard"
GUARD_WAIT_S = 20.0


def _read(path):
    # type: (str) -> Optional[Dict[str, Any]]
    try:
        with open(path) as fh:
            data = json.load(fh)
            return data if isinstance(data, dict) else None
    except (IOError, OSError, ValueError):
        return None


def _expired(lease, now):
    # type: (Dict[str, Any], float) -> bool
    try:
        return float(lease.get("expires_at", 0)) <= now
    except (TypeError, ValueError):
        return True


def _write(lease):
    # type: (Dict[str, Any]) -> None
    fd, tmp = tempfile.mkstemp(prefix=".rollout.lease.", dir=LEASE_DIR)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as fh:
            json.dump(lease, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, LEASE)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def handle(req):
    # type: (Dict[str, Any]) -> Dict[str, Any]
    now = time.time()
    op = req.get("op")
    current = _read(LEASE)
    if op == "read":
        expired = current is not None and _expired(current, now)
        return {"result": "held" if current else "absent", "holder": current, "expired": expired, "now": now}
    if op == "release":
        if current is None:
            return {"result": "absent"}
        if current.get("run_id") != req.get("run_id"):
            return {"result": "not-ours", "holder": current}
        os.unlink(LEASE)
        return {"result": "released"}
    if op != "acquire":
        return {"result": "error", "error": "unknown op %r" % (op,)}
    mine = {
        "run_id": req["run_id"],
        "change": req.get("change") or "",
        "fleet": req.get("fleet"),
        "controller": req.get("controller"),
        "user": req.get("user"),
        "pid": req.get("pid"),
        "hosts": req.get("hosts", []),
        "acquired_at": now,
        "expires_at": now + float(req["ttl_s"]),
    }
    if current is None:
        _write(mine)
        return {"result": "acquired", "lease": mine}
    if current.get("run_id") == req["run_id"]:
        mine["acquired_at"] = current.get("acquired_at", now)
        _write(mine)
        return {"result": "renewed", "lease": mine}
    if _expired(current, now) or (req.get("stale_run_id") and current.get("run_id") == req.get("stale_run_id")):
        # expired, or held by a run its own controller found dead (the controller names the run it replaces)
        _write(mine)
        return {"result": "took-over", "lease": mine, "stale": current, "now": now}
    return {"result": "held", "holder": current, "now": now}


def _denied(exc):
    # type: (EnvironmentError) -> str
    """Why the lease cannot be taken, in one line: a non-root user without escalation is named with the fix."""
    euid = os.geteuid()
    if euid != 0:
        return ("%s: %s: running as uid %d, not root: set ansible_become: true (passwordless sudo) for this host, or"
                " log in as root" % (exc.filename or LEASE_DIR, exc.strerror or exc, euid))
    return "%s: %s" % (exc.filename or LEASE_DIR, exc.strerror or exc)


def main(argv):
    # type: (List[str]) -> int
    req = json.loads(base64.b64decode(argv[1]).decode("utf-8"))
    try:
        if not os.path.isdir(LEASE_DIR):
            os.makedirs(LEASE_DIR, 0o755)
        guard = os.open(GUARD, os.O_RDWR | os.O_CREAT, 0o600)
    except (IOError, OSError) as exc:
        print(json.dumps({"result": "error", "euid": os.geteuid(), "error": _denied(exc)}))
        return 0
    try:
        deadline = time.monotonic() + GUARD_WAIT_S
        while True:
            try:
                fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except (IOError, OSError):
                if time.monotonic() >= deadline:
                    print(json.dumps({"result": "error", "error": "lease guard busy for %.0f s" % GUARD_WAIT_S}))
                    return 0
                time.sleep(0.05)
        print(json.dumps(handle(req)))
    finally:
        os.close(guard)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
