"""``invoke remediate``: the closed loop that fixes what is safe to fix within guardrails and escalates the rest.

This package decides; it does not act yet. :mod:`~remediation.remediate.policy` says per finding ID how far the loop
may go (observe, propose, auto) and when a reboot is allowed (:mod:`~remediation.remediate.windows`);
:mod:`~remediation.remediate.guards` holds the fleet guards (in-flight cap, circuit breaker, attempt budget);
:mod:`~remediation.remediate.state` keeps what must survive between runs (attempts, findings seen, the breaker);
:mod:`~remediation.remediate.plan` turns an audit, the policy, the state and the clock into one decision per host and
finding. Every function here is pure but the state file's load, save and lock. The tasks call
:mod:`remediation.remediate.api`.
"""
