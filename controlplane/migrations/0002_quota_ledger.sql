-- limitplane control plane, schema version 2: the global-quota ledger
-- (issue 22; controlplane.QuotaLedgerStore), apart from the configuration:
-- no revision, no change log. One table of records by id, the kinds told
-- apart by the id's prefix (the quota server's layout): "e/" a ledger
-- entry (a quotaledger.State in JSON), "a/" a period anchor, "d/" a data
-- plane's totals. value NULL is a placeholder a writer inserted to hold
-- the id while it decides (deleted again unless written); expires is when
-- PruneQuota may delete the row (NULL: never).
CREATE TABLE lp_quota (
	id      text COLLATE "C" PRIMARY KEY,
	value   bytea,
	expires timestamptz
);
CREATE INDEX lp_quota_expires ON lp_quota (expires) WHERE expires IS NOT NULL;
