// Package servertest holds the pool tests that need whole tetherd
// replicas (internal/testcp) sharing one PostgreSQL database. It has no
// code of its own; it keeps those heavy tests out of the pool package's
// own test binary.
package servertest
