-- CA rotation (docs/design.md §3.10, docs/adr/0040-ca-rotation-set-in-the-store.md):
-- every CA of the set, its key sealed under the data dir's credentials.key
-- (empty for the CA of `tetherd init`, kept in the data dir), and which
-- CA signed each certificate. '' is the one CA before rotation existed.
CREATE TABLE certificate_authorities (
    fingerprint      TEXT COLLATE "C" PRIMARY KEY,
    cert_pem         TEXT NOT NULL,
    key_sealed       BYTEA NOT NULL,
    cross_pem        TEXT NOT NULL DEFAULT '',
    state            TEXT NOT NULL,
    not_after        BIGINT NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
-- At most one prepared and one active CA, on every replica at once.
CREATE UNIQUE INDEX certificate_authorities_one_per_state ON certificate_authorities (state)
    WHERE state IN ('prepared', 'active');

ALTER TABLE certificates ADD COLUMN issuer TEXT COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX certificates_issuer ON certificates (issuer, not_after);
