"""The shared core: findings and their catalog, the checks (one rule per finding ID), the parsers of host text,
the facts model, SKUs, exit codes and the exception family's root. Imports no other layer."""
