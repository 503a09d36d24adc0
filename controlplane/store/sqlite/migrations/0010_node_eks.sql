-- TPM endorsement keys bind a machine's hardware identity to its node
-- (docs/design.md §3.4, docs/adr/0024-node-ek-bindings.md). Each hash is
-- sha256:HEX of the EK public key; the primary key makes an EK belong to
-- one node at most, across every replica.
CREATE TABLE node_eks (
    ek_hash    TEXT NOT NULL PRIMARY KEY,
    node_id    TEXT NOT NULL REFERENCES nodes (id),
    position   INTEGER NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX node_eks_node ON node_eks (node_id);

-- A node or template that requires attestation refuses token enrollment.
ALTER TABLE nodes ADD COLUMN require_attestation BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE templates ADD COLUMN require_attestation BOOLEAN NOT NULL DEFAULT FALSE;
