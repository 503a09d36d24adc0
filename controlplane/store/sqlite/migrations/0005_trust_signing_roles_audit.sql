-- Module signers, verified signatures (one per signer), templates' required
-- signers, admin identities and the audit trail.

ALTER TABLE templates ADD COLUMN required_signers TEXT NOT NULL DEFAULT '';

CREATE TABLE signers (
    fingerprint TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    public_key  BLOB NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE module_signatures (
    module_name    TEXT NOT NULL,
    module_version TEXT NOT NULL,
    signer         TEXT NOT NULL,
    signer_name    TEXT NOT NULL,
    public_key     BLOB NOT NULL,
    signature      BLOB NOT NULL,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (module_name, module_version, signer),
    FOREIGN KEY (module_name, module_version) REFERENCES modules (name, version)
);

CREATE TABLE admin_identities (
    name       TEXT PRIMARY KEY,
    role       TEXT NOT NULL,
    serial     TEXT NOT NULL,
    not_after  BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);

CREATE TABLE audit (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         BIGINT NOT NULL,
    identity   TEXT NOT NULL,
    role       TEXT NOT NULL,
    serial     TEXT NOT NULL,
    method     TEXT NOT NULL,
    target     TEXT NOT NULL,
    code       TEXT NOT NULL
);
CREATE INDEX audit_identity ON audit (identity, id);
CREATE INDEX audit_at ON audit (at);
