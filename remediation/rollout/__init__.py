"""Rolling changes of the fleet: one engine (:mod:`.engine`), its fleet lock and host leases (:mod:`.lock`, the
host side in :mod:`remediation.hostside.hostlease`), the journal every change writes on a host before it changes it
(:mod:`.journal`) and the cordon marker (:mod:`.cordon`). The changes are adapters on the engine:
``remediation.restore`` (apt, the Azure driver extension) and ``remediation.kernelupdate``.

This package keeps its ``__init__`` free of imports so that the leaf modules (the journal, read by the roles' filter
plugins; the cordon marker, read by the restore rules) load without the engine.
"""
