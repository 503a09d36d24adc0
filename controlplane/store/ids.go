package store

// Typed identifiers. A record's ID, and every reference to it from
// another record or a service's signature, has its own type, so that one
// kind of id cannot be passed where another is wanted (docs/adr/0050).
// They are the ids the backends generate (UUIDv7 text), stored as text.

// TemplateID names a template by its id (a node or pool names it so).
type TemplateID string

func (id TemplateID) String() string { return string(id) }

// TaskID names a task.
type TaskID string

func (id TaskID) String() string { return string(id) }

// InstanceID names an instance: its record, and every record that names
// one (a task's, an event's, a token's, a certificate's, a presence's).
type InstanceID string

func (id InstanceID) String() string { return string(id) }

// NodeID names a node: its record, and the instances and EK bindings that
// name it.
type NodeID string

func (id NodeID) String() string { return string(id) }

// PoolID names a pool: its record, and the members and events that name
// it.
type PoolID string

func (id PoolID) String() string { return string(id) }

// ClaimID names one claim of a pool member: the member's record while it
// is claimed, the claim's events (as their correlation id) and the
// release that ends it.
type ClaimID string

func (id ClaimID) String() string { return string(id) }

// Correlation is the correlation id of the claim's events.
func (id ClaimID) Correlation() CorrelationID { return CorrelationID(id) }

// CorrelationID ties together the events of one operation: a task's id, a
// claim's id, or "mac:" and an address for what a machine announced.
type CorrelationID string

func (id CorrelationID) String() string { return string(id) }

// Correlation is the correlation id of the task's events.
func (id TaskID) Correlation() CorrelationID { return CorrelationID(id) }

// CertSerial names an issued certificate by its serial number (lowercase
// hex, as pki/ca.SerialString writes it): its record, the admin identity
// and audit record that name it, and the revocation set.
type CertSerial string

func (s CertSerial) String() string { return string(s) }
