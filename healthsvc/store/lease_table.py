"""The statements of the ``leases`` table (migration 2): which replica holds which run's lease.

SQL lives in the store; :mod:`healthsvc.ownership.leases` decides when to run which (claims on a
run's activity, renewals and sweeps on its thread, the release at stop), and
:mod:`healthsvc.store.fencing` checks a held lease inside a write's transaction.
"""
from __future__ import annotations

from healthsvc.store.fencing import DB_NOW

# The table is the store's (migration 2 of ``migrations``: run_id, owner, token, expires_at in unix
# seconds). Every time below is the database's clock (one clock for every replica); ttl_s is a
# parameter. _NOW is that clock in the table's unit.
_NOW = DB_NOW

CLAIM = f"""
INSERT INTO leases AS l (run_id, owner, token, expires_at)
VALUES (%(run)s, %(me)s, 1, {_NOW} + %(ttl)s)
ON CONFLICT (run_id) DO UPDATE
    SET owner = excluded.owner, token = l.token + 1, expires_at = excluded.expires_at
    WHERE l.expires_at < {_NOW}
RETURNING token
"""
HOLDER = f"SELECT owner, expires_at - {_NOW} FROM leases WHERE run_id = %s"
RENEW = f"""
UPDATE leases l SET expires_at = {_NOW} + %(ttl)s
FROM unnest(%(runs)s::text[], %(tokens)s::bigint[]) AS h(run_id, token)
WHERE l.run_id = h.run_id AND l.token = h.token AND l.owner = %(me)s
RETURNING l.run_id
"""
# Other replicas sweep at the same time: SKIP LOCKED spreads a dead owner's runs over them. A
# lease let go (owner '', see RELEASE_FINISHED) of a run still finished is nobody's to take: the
# run's next activity claims it (CLAIM); one that runs again (resumed elsewhere) is swept.
SWEEP = f"""
UPDATE leases l SET owner = %(me)s, token = l.token + 1, expires_at = {_NOW} + %(ttl)s
WHERE l.run_id IN (SELECT s.run_id FROM leases s WHERE s.expires_at < {_NOW}
                   AND (s.owner <> '' OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = s.run_id
                                                     AND r.status = 'finished'))
                   ORDER BY s.expires_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING l.run_id, l.token
"""
# The owner lets go of a finished, quiet run: the row stays (its token goes on counting at the next
# claim, so fencing tokens only grow), expired and owned by nobody.
RELEASE_FINISHED = f"""
UPDATE leases SET owner = '', expires_at = {_NOW} - 0.001
WHERE run_id = %(run)s AND token = %(token)s AND owner = %(me)s
RETURNING run_id
"""
# A run can exist with no lease at all: the replica that stored its first push died before its
# monitor claimed it (the claim follows the commit). Nobody would sweep it, and a job that then
# hangs would never be watched; so each sweep first gives such running runs an expired lease row,
# which the sweep then takes like any other. Only runs created a TTL ago or more: a younger one's
# creator is still claiming it, and a sweep elsewhere would take the run from the replica its
# pushes go to (the balancer hashes a run's pushes to one replica: docs/scale-out.md), making
# every later push remote. A creator that died is then replaced within two TTLs, not one.
ADOPT_ORPHANS = f"""
INSERT INTO leases (run_id, owner, token, expires_at)
SELECT r.run_id, '', 0, 0 FROM runs r
WHERE r.status = 'running' AND r.created_at < {_NOW} - %(ttl)s
  AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.run_id = r.run_id)
ON CONFLICT (run_id) DO NOTHING
"""
# A restarted replica (the same id: host and port) takes its previous life's leases back at once.
RECLAIM = f"""
UPDATE leases SET token = token + 1, expires_at = {_NOW} + %(ttl)s WHERE owner = %(me)s
RETURNING run_id, token
"""
RELEASE = f"""
UPDATE leases l SET expires_at = {_NOW} - 0.001
FROM unnest(%(runs)s::text[], %(tokens)s::bigint[]) AS h(run_id, token)
WHERE l.run_id = h.run_id AND l.token = h.token AND l.owner = %(me)s
"""

# A push accepted here, announced to the run's owner on its channel (``LISTEN`` there).
NOTIFY = "SELECT pg_notify(%s, %s)"


def listen(channel: str) -> str:
    """The statement that subscribes a connection to ``channel`` (an SQL identifier)."""
    return f"LISTEN {channel}"
