-- BMC credentials, sealed by the control plane (the store never sees a
-- password in the clear), and each node's BMC: its Redfish address, the
-- credential it uses and how its TLS certificate is verified.

CREATE TABLE credentials (
    name       TEXT PRIMARY KEY,
    username   TEXT NOT NULL,
    sealed     BLOB NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

ALTER TABLE nodes ADD COLUMN bmc_address TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN bmc_credential TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN bmc_ca TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN bmc_fingerprint TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN bmc_insecure BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE nodes ADD COLUMN bmc_boot_mode TEXT NOT NULL DEFAULT '';
CREATE INDEX nodes_bmc_credential ON nodes (bmc_credential);
