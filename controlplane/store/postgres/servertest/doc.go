// Package servertest holds the server-level tests of the PostgreSQL
// backend: whole tetherd replicas (internal/testcp) sharing one database,
// a PostgreSQL restart under API load, and the enrollment benchmark on
// both stores. It has no code of its own; it exists so that these heavy
// tests (they build the whole control plane) stay out of the store
// package's own test binary.
package servertest
