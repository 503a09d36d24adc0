-- The key an enrollment spent a token for (sha256:HEX of the CSR's
-- SubjectPublicKeyInfo): a node whose answer was lost on the way (a cut
-- connection, a replica that died after its commit) retries with the same
-- token and the same key, and gets a certificate for that key again
-- instead of a refusal that strands it (docs/design.md §3.2).
ALTER TABLE tokens ADD COLUMN spent_key TEXT NOT NULL DEFAULT '';
