-- limitplane control plane, schema version 1.
-- IDs and key hashes sort byte-wise (COLLATE "C"), as the Reader lists
-- them; values are spec's JSON exactly as the store wrote it (bytea, not
-- jsonb, which would reorder it).
CREATE TABLE lp_meta (
	id       boolean PRIMARY KEY DEFAULT true CHECK (id), -- one row
	revision bigint  NOT NULL,                            -- the single revision counter
	history  text    NOT NULL                             -- the history id (Store.History)
);
CREATE TABLE lp_policies (
	id    text COLLATE "C" PRIMARY KEY,
	value bytea NOT NULL
);
CREATE TABLE lp_keys (
	id    text COLLATE "C" PRIMARY KEY, -- lower-case key hash
	value bytea NOT NULL
);
CREATE TABLE lp_apis (
	id    text COLLATE "C" PRIMARY KEY,
	value bytea NOT NULL
);
-- The change log: the changes of the latest revisions, in order.
CREATE TABLE lp_changes (
	revision bigint NOT NULL,
	seq      int    NOT NULL,
	change   bytea  NOT NULL, -- a Change in JSON
	PRIMARY KEY (revision, seq)
);
