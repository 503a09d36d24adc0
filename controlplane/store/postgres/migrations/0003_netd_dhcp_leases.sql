-- Addresses tetherd's own DHCP server (full mode) leased. The primary key
-- and the unique mac make an address leased to one machine at most and a
-- machine hold one address, whichever replica wrote it.
CREATE TABLE dhcp_leases (
    ip         TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    mac        TEXT COLLATE "C" NOT NULL UNIQUE,
    expires_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
