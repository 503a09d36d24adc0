-- Hardware addresses bind a netbooting machine to its node. The primary key
-- makes an address belong to one node at most, across every replica.
CREATE TABLE node_macs (
    mac      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    node_id  TEXT COLLATE "C" NOT NULL REFERENCES nodes (id),
    position INTEGER NOT NULL
);
CREATE INDEX node_macs_node ON node_macs (node_id);
