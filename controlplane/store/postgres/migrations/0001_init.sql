-- Mirrors sqlite/migrations/0001_init.sql; the queries (sqlstore) are
-- shared, so the two schemas change together.
--
-- Times are BIGINT microseconds since the epoch (see sqlstore/convert.go).
-- Keys and names are TEXT COLLATE "C": pages are cut with "name > ?" and
-- sorted by the same column, and byte order matches SQLite and Go, whatever
-- locale the database was created with.

CREATE TABLE templates (
    id               TEXT COLLATE "C" PRIMARY KEY,
    name             TEXT COLLATE "C" NOT NULL UNIQUE,
    kernel_digest    TEXT NOT NULL DEFAULT '',
    initramfs_digest TEXT NOT NULL DEFAULT '',
    kernel_args      TEXT NOT NULL DEFAULT '',
    require_signed   BOOLEAN NOT NULL DEFAULT FALSE,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);

CREATE TABLE modules (
    name       TEXT COLLATE "C" NOT NULL,
    version    TEXT COLLATE "C" NOT NULL,
    digest     TEXT COLLATE "C" NOT NULL,
    size       BIGINT NOT NULL,
    signature  BYTEA NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE INDEX modules_digest ON modules (digest);

CREATE TABLE template_modules (
    template_id    TEXT COLLATE "C" NOT NULL REFERENCES templates (id),
    kind           TEXT COLLATE "C" NOT NULL,
    position       INTEGER NOT NULL,
    module_name    TEXT COLLATE "C" NOT NULL,
    module_version TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (template_id, kind, position),
    FOREIGN KEY (module_name, module_version) REFERENCES modules (name, version)
);
CREATE INDEX template_modules_module ON template_modules (module_name, module_version);

CREATE TABLE nodes (
    id             TEXT COLLATE "C" PRIMARY KEY,
    name           TEXT COLLATE "C" NOT NULL UNIQUE,
    template_id    TEXT COLLATE "C" NOT NULL REFERENCES templates (id),
    enabled        BOOLEAN NOT NULL,
    config         TEXT NOT NULL,
    public_address TEXT NOT NULL DEFAULT '',
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL
);
CREATE INDEX nodes_template ON nodes (template_id);

CREATE TABLE pools (
    id                  TEXT COLLATE "C" PRIMARY KEY,
    name                TEXT COLLATE "C" NOT NULL UNIQUE,
    template_id         TEXT COLLATE "C" NOT NULL REFERENCES templates (id),
    provider            TEXT NOT NULL,
    region              TEXT NOT NULL,
    instance_type       TEXT NOT NULL,
    lifecycle_class     TEXT NOT NULL,
    target_size         INTEGER NOT NULL,
    min_size            INTEGER NOT NULL,
    max_size            INTEGER NOT NULL,
    status              TEXT NOT NULL,
    metadata            TEXT NOT NULL,
    last_replenished_at BIGINT,
    created_at          BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL
);
CREATE INDEX pools_template ON pools (template_id);

CREATE TABLE instances (
    id                       TEXT COLLATE "C" PRIMARY KEY,
    node_id                  TEXT COLLATE "C" NOT NULL REFERENCES nodes (id),
    status                   TEXT NOT NULL,
    provider                 TEXT NOT NULL,
    region                   TEXT NOT NULL,
    instance_type            TEXT NOT NULL,
    cloud_instance_id        TEXT NOT NULL,
    operation_id             TEXT COLLATE "C" UNIQUE,
    pool_id                  TEXT COLLATE "C" REFERENCES pools (id),
    pool_state               TEXT NOT NULL,
    pool_warming_started_at  BIGINT,
    pool_ready_at            BIGINT,
    pool_acquired_at         BIGINT,
    claim_id                 TEXT NOT NULL,
    acquired_by              TEXT NOT NULL,
    acquired_for             TEXT NOT NULL,
    pool_terminate_attempts  INTEGER NOT NULL,
    pool_next_terminate_at   BIGINT,
    claimed_stale_flagged    BOOLEAN NOT NULL,
    heartbeat_stale_flagged  BOOLEAN NOT NULL,
    hold                     BOOLEAN NOT NULL,
    hold_reason              TEXT NOT NULL,
    cordon_by                TEXT,
    cordon_reason            TEXT,
    cordon_at                BIGINT,
    cordon_pool_state_before TEXT,
    last_heartbeat_at        BIGINT,
    agent_phase              TEXT NOT NULL,
    agent_version            TEXT NOT NULL,
    running_modules          TEXT NOT NULL,
    agent_error              TEXT NOT NULL,
    addresses                TEXT NOT NULL,
    boot_id                  TEXT NOT NULL,
    silent_since             BIGINT,
    error_message            TEXT NOT NULL,
    terminate_requested_at   BIGINT,
    created_at               BIGINT NOT NULL,
    updated_at               BIGINT NOT NULL
);
CREATE INDEX instances_node ON instances (node_id);
CREATE INDEX instances_status ON instances (status);
CREATE INDEX instances_pool ON instances (pool_id, pool_state, pool_warming_started_at);

CREATE TABLE tokens (
    hash        TEXT COLLATE "C" PRIMARY KEY,
    instance_id TEXT COLLATE "C" NOT NULL,
    expires_at  BIGINT NOT NULL,
    used_at     BIGINT,
    created_at  BIGINT NOT NULL
);
CREATE INDEX tokens_instance ON tokens (instance_id);

CREATE TABLE certificates (
    serial        TEXT COLLATE "C" PRIMARY KEY,
    instance_id   TEXT COLLATE "C" NOT NULL,
    kind          TEXT NOT NULL,
    subject       TEXT NOT NULL,
    not_before    BIGINT NOT NULL,
    not_after     BIGINT NOT NULL,
    revoked_at    BIGINT,
    revoke_reason TEXT NOT NULL,
    created_at    BIGINT NOT NULL
);
CREATE INDEX certificates_instance ON certificates (instance_id);
CREATE INDEX certificates_revoked ON certificates (revoked_at) WHERE revoked_at IS NOT NULL;

CREATE TABLE tasks (
    id               TEXT COLLATE "C" PRIMARY KEY,
    target           TEXT COLLATE "C" NOT NULL,
    instance_id      TEXT COLLATE "C" NOT NULL,
    kind             TEXT NOT NULL,
    payload          TEXT NOT NULL,
    status           TEXT COLLATE "C" NOT NULL,
    lease_owner      TEXT NOT NULL,
    lease_expires_at BIGINT,
    attempts         INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    exit_code        INTEGER,
    output           BYTEA NOT NULL,
    output_truncated BOOLEAN NOT NULL,
    error_message    TEXT NOT NULL,
    progress         TEXT NOT NULL,
    cancel_requested BOOLEAN NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE INDEX tasks_claim ON tasks (status, target, instance_id, created_at);
CREATE INDEX tasks_instance ON tasks (instance_id);
CREATE INDEX tasks_lease ON tasks (status, lease_expires_at);

CREATE TABLE events (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind           TEXT COLLATE "C" NOT NULL,
    severity       INTEGER NOT NULL,
    instance_id    TEXT COLLATE "C" NOT NULL,
    pool_id        TEXT COLLATE "C" NOT NULL,
    correlation_id TEXT COLLATE "C" NOT NULL,
    message        TEXT NOT NULL,
    payload        TEXT NOT NULL,
    created_at     BIGINT NOT NULL
);
CREATE INDEX events_kind ON events (kind, id);
CREATE INDEX events_instance ON events (instance_id, id);
CREATE INDEX events_pool ON events (pool_id, id);
CREATE INDEX events_correlation ON events (correlation_id, id);
CREATE INDEX events_created ON events (created_at);
