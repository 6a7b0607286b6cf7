"""Escalation: what a person gets when remediation will not (or may not) fix a host by itself.

- :mod:`remediation.escalation.page`: a page to an Alertmanager-compatible webhook (payload version 4), with a stable
  dedupe key per (host, finding, boot), posted with a bounded retry; a bearer token never appears in a message;
- :mod:`remediation.escalation.packet`: the evidence packet for one host's finding (NVML facts, Xid lines, ``dkms
  status``, package holds, the incident report) and the Azure Guest Health Reporting payload that maps the finding
  to one of Azure's documented HPC impact categories.

Both take a :class:`~remediation.core.findings.Finding` and, for the packet, the host's
:class:`~remediation.core.facts.HostFacts`; neither decides *whether* to escalate (that is the remediation policy's).
"""

from __future__ import annotations

from remediation.core.errors import RemediationError

__all__ = ["EscalationError"]


class EscalationError(RemediationError):
    """A page or packet setting is unusable (a URL, a token over plain http); nothing was sent."""
