// Package store is the control plane's persistence contract. Backends
// (sqlite, postgres) implement Store over one shared SQL layer (sqlstore);
// the storetest suite keeps them honest. Nothing above this package may
// assume which backend it runs on.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
)

// Sentinel errors. Backends wrap them with context; callers test with
// errors.Is and map them to gRPC codes in one place (controlplane/api).
var (
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists is a unique-key violation.
	ErrAlreadyExists = errors.New("already exists")
	// ErrConflict means the row is not in the state the write requires
	// (a spent token, a row referenced by another).
	ErrConflict = errors.New("conflict")
	// ErrUnavailable means the database cannot be reached; retry later.
	ErrUnavailable = errors.New("store unavailable")
)

// Errorf wraps a sentinel with a message: Errorf(ErrNotFound, "instance %q", id).
func Errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), sentinel)
}

// Store is a backend.
type Store interface {
	// Queries outside a transaction run in autocommit mode.
	Queries
	// Tx runs fn in one transaction. If fn returns an error, nothing it
	// wrote is kept and no notification it queued is sent. On SQLite the
	// transaction is IMMEDIATE (it takes the write lock up front); on
	// PostgreSQL it is READ COMMITTED with row locks where the method says so,
	// and a transaction PostgreSQL aborts as a deadlock victim or for a
	// serialization failure is run again (a few times at most, then
	// ErrUnavailable): fn may be called more than once and must not carry
	// effects of one attempt into the next.
	Tx(ctx context.Context, fn func(q Queries) error) error
	// Subscribe delivers the payload of every Notify on channel, from any
	// replica sharing the database, after the notifying transaction commits.
	// Delivery is best effort (a slow reader drops notifications), so a
	// subscriber treats a notification as a hint to re-read the store.
	Subscribe(channel string) (<-chan string, func())
	// Elector runs periodic loops on one replica at a time.
	Elector() Elector
	// Backend names the backend ("sqlite", "postgres") for logs and metrics.
	Backend() string
	Close() error
}

// Notification channels.
const (
	ChannelEvents      = "tether_events"      // payload: event id
	ChannelTasks       = "tether_tasks"       // payload: instance id
	ChannelRevocations = "tether_revocations" // payload: certificate serial
	ChannelAuthorities = "tether_authorities" // payload: CA fingerprint
	ChannelInstances   = "tether_instances"   // payload: instance id
)

// Elector grants leadership of named loops.
type Elector interface {
	// Campaign blocks until this replica leads name or ctx ends. The
	// returned context is cancelled when leadership is lost; call release
	// to give it up.
	Campaign(ctx context.Context, name string) (lead context.Context, release func(), err error)
}

// Page bounds a list. After is the opaque cursor from the previous page.
type Page struct {
	Limit int
	After string
}

// DefaultPageSize and MaxPageSize bound Page.Limit.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Normalize applies the default and the maximum.
func (p Page) Normalize() Page {
	if p.Limit <= 0 {
		p.Limit = DefaultPageSize
	}
	if p.Limit > MaxPageSize {
		p.Limit = MaxPageSize
	}
	return p
}

// Queries is every read and write, one interface per aggregate; a
// service that needs only one may take that one. The same methods run in
// autocommit mode (on Store) and inside a transaction (in Tx's callback).
type Queries interface {
	// Notify queues a notification; inside a transaction it is sent on commit.
	Notify(ctx context.Context, channel, payload string) error

	TemplateQueries
	ModuleQueries
	SignerQueries
	IdentityQueries
	AuditQueries
	NodeQueries
	CredentialQueries
	InstanceQueries
	TokenQueries
	CertificateQueries
	AuthorityQueries
	TaskQueries
	EventQueries
	RetentionQueries
	PoolQueries
	DHCPQueries
	PresenceQueries
}

// TemplateQueries keep the templates nodes boot.
type TemplateQueries interface {
	CreateTemplate(ctx context.Context, t *Template) error
	GetTemplate(ctx context.Context, name string) (*Template, error)
	GetTemplateByID(ctx context.Context, id TemplateID) (*Template, error)
	ListTemplates(ctx context.Context, p Page) ([]*Template, error)
	UpdateTemplate(ctx context.Context, t *Template) error
	// DeleteTemplate refuses (ErrConflict) while a node or pool uses it.
	DeleteTemplate(ctx context.Context, name string) error
}

// ModuleQueries keep the module catalogue and its signatures.
type ModuleQueries interface {
	CreateModule(ctx context.Context, m *Module) error
	GetModule(ctx context.Context, name, version string) (*Module, error)
	ListModules(ctx context.Context, name string, p Page) ([]*Module, error)
	// DeleteModule refuses (ErrConflict) while a template references it.
	DeleteModule(ctx context.Context, name, version string) error
	// CountModulesWithDigest tells whether a blob is still referenced.
	CountModulesWithDigest(ctx context.Context, digest string) (int, error)
	// AddModuleSignature records a signature (one per signer: a second
	// one by the same signer replaces the first).
	AddModuleSignature(ctx context.Context, name, version string, sig ModuleSignature) error
}

// SignerQueries keep the registered module signing keys.
type SignerQueries interface {
	CreateSigner(ctx context.Context, s *Signer) error
	ListSigners(ctx context.Context) ([]*Signer, error)
	// DeleteSigner removes a signer by name or fingerprint.
	DeleteSigner(ctx context.Context, nameOrFingerprint string) error
}

// IdentityQueries keep the admin identities.
type IdentityQueries interface {
	// CreateAdminIdentity records a new identity, or replaces the
	// certificate of an existing one (renewal).
	PutAdminIdentity(ctx context.Context, id *AdminIdentity) error
	GetAdminIdentity(ctx context.Context, name string) (*AdminIdentity, error)
	ListAdminIdentities(ctx context.Context) ([]*AdminIdentity, error)
}

// AuditQueries keep the audit trail.
type AuditQueries interface {
	AppendAudit(ctx context.Context, r *AuditRecord) error
	ListAudit(ctx context.Context, f AuditFilter) ([]*AuditRecord, error)
	// DeleteAuditBefore trims the audit trail, as event retention does:
	// at most limit records, the oldest first (all when limit <= 0).
	DeleteAuditBefore(ctx context.Context, before time.Time, limit int) (int, error)
}

// NodeQueries keep the nodes, their hardware addresses and EK bindings.
type NodeQueries interface {
	// CreateNode and UpdateNode write n.MACs and n.EKHashes too
	// (UpdateNode replaces both sets); an address of another node is a
	// *MACInUseError, an EK hash of another node an *EKInUseError. Call
	// them in a transaction when n has either, so a refusal leaves nothing.
	CreateNode(ctx context.Context, n *Node) error
	GetNode(ctx context.Context, name string) (*Node, error)
	GetNodeByID(ctx context.Context, id NodeID) (*Node, error)
	// NodeNames maps node ids to names in one query, for lists that show
	// a name beside each row; an id with no node is absent from the map.
	NodeNames(ctx context.Context, ids []NodeID) (map[NodeID]string, error)
	// GetNodeByMAC finds the node owning a normalised hardware address.
	GetNodeByMAC(ctx context.Context, mac string) (*Node, error)
	// NodeByEK finds the node an EK hash (sha256:HEX, lower case) is bound
	// to; ErrNotFound when none is.
	NodeByEK(ctx context.Context, hash string) (*Node, error)
	// EKNodeID is the id of the node an EK hash is bound to, without the
	// node: what an attested enrollment checks on its every step.
	EKNodeID(ctx context.Context, hash string) (NodeID, error)
	ListNodes(ctx context.Context, f NodeFilter, p Page) ([]*Node, error)
	UpdateNode(ctx context.Context, n *Node) error
	// DeleteNode refuses (ErrConflict) while a non-terminated instance of it exists.
	DeleteNode(ctx context.Context, name string) error
}

// CredentialQueries keep the sealed BMC credentials.
type CredentialQueries interface {
	// CreateCredential refuses (ErrAlreadyExists) a name that is taken.
	CreateCredential(ctx context.Context, c *Credential) error
	GetCredential(ctx context.Context, name string) (*Credential, error)
	// UpdateCredential writes c's user name, sealed password and update time.
	UpdateCredential(ctx context.Context, c *Credential) error
	// ListCredentials is by name.
	ListCredentials(ctx context.Context) ([]*Credential, error)
	// DeleteCredential refuses (ErrConflict) while a node's BMC names it.
	DeleteCredential(ctx context.Context, name string) error
}

// InstanceQueries keep the instances and their heartbeats.
type InstanceQueries interface {
	CreateInstance(ctx context.Context, in *Instance) error
	GetInstance(ctx context.Context, id InstanceID) (*Instance, error)
	// InstanceStatus reads only an instance's state (ErrNotFound if there
	// is no such instance): enrollment checks it for every certificate,
	// and the whole row cost it a third of its store work.
	InstanceStatus(ctx context.Context, id InstanceID) (lifecycle.State, error)
	// InstanceNode is an instance's node id and state, in one row: what
	// an attested enrollment's opening checks before anything else.
	InstanceNode(ctx context.Context, id InstanceID) (nodeID NodeID, status lifecycle.State, err error)
	// EnrollGate reads an instance's state and whether its node or
	// template requires attestation, in one query (ErrNotFound if there
	// is no such instance).
	EnrollGate(ctx context.Context, instanceID InstanceID) (EnrollGate, error)
	// LockInstance reads an instance and, on PostgreSQL, locks its row
	// until the transaction ends. Use it before a read-modify-write.
	LockInstance(ctx context.Context, id InstanceID) (*Instance, error)
	GetInstanceByOperationID(ctx context.Context, operationID string) (*Instance, error)
	ListInstances(ctx context.Context, f InstanceFilter, p Page) ([]*Instance, error)
	CountInstances(ctx context.Context, f InstanceFilter) (int, error)
	// UpdateInstance writes every mutable column.
	UpdateInstance(ctx context.Context, in *Instance) error
	// RecordHeartbeats writes a batch of coalesced heartbeats.
	RecordHeartbeats(ctx context.Context, hbs []Heartbeat) error
}

// TokenQueries keep the bootstrap tokens.
type TokenQueries interface {
	CreateToken(ctx context.Context, t *Token) error
	GetToken(ctx context.Context, hash string) (*Token, error)
	// ConsumeToken marks an unused, unexpired token used, for the key
	// spentKey (see Token.SpentKey). It returns ErrNotFound for an unknown
	// token and ErrConflict (wrapping ErrTokenUsed or ErrTokenExpired)
	// otherwise, with the token.
	ConsumeToken(ctx context.Context, hash, spentKey string, now time.Time) (*Token, error)
	// ExpireInstanceTokens ends every unused token of an instance.
	ExpireInstanceTokens(ctx context.Context, instanceID InstanceID, now time.Time) (int, error)
}

// CertificateQueries keep the issued certificates and their revocations.
type CertificateQueries interface {
	CreateCertificate(ctx context.Context, c *Certificate) error
	// CountLiveCertificates counts, per issuing CA fingerprint, the
	// certificates neither revoked nor expired at now.
	CountLiveCertificates(ctx context.Context, now time.Time) (map[string]int, error)
	// AssignCertificateIssuer sets issuer on every certificate recorded
	// without one (before CA rotation existed, one CA signed them all).
	AssignCertificateIssuer(ctx context.Context, issuer string) (int, error)
	GetCertificate(ctx context.Context, serial CertSerial) (*Certificate, error)
	ListCertificates(ctx context.Context, f CertificateFilter, p Page) ([]*Certificate, error)
	RevokeCertificate(ctx context.Context, serial CertSerial, reason string, now time.Time) (*Certificate, error)
	// RevokeInstanceCertificates revokes every unrevoked certificate of an
	// instance and returns their serials.
	RevokeInstanceCertificates(ctx context.Context, instanceID InstanceID, reason string, now time.Time) ([]CertSerial, error)
	// ListRevokedSerials lists revoked certificates that have not expired
	// by now: the only ones a revocation check still needs.
	ListRevokedSerials(ctx context.Context, now time.Time) ([]CertSerial, error)
}

// AuthorityQueries keep the CA rotation set (docs/design.md §3.10).
type AuthorityQueries interface {
	// CreateAuthority records a CA of the rotation set. At most one is
	// prepared and one active: another is ErrAlreadyExists.
	CreateAuthority(ctx context.Context, a *Authority) error
	// ListAuthorities is every CA, oldest first.
	ListAuthorities(ctx context.Context) ([]*Authority, error)
	// SetAuthorityState moves a CA from state from to state to;
	// ErrConflict if it is not in from, ErrNotFound if there is none.
	SetAuthorityState(ctx context.Context, fingerprint, from, to string, now time.Time) error
}

// TaskQueries keep the tasks and their leases.
type TaskQueries interface {
	CreateTask(ctx context.Context, t *Task) error
	GetTask(ctx context.Context, id TaskID) (*Task, error)
	LockTask(ctx context.Context, id TaskID) (*Task, error)
	ListTasks(ctx context.Context, f TaskFilter, p Page) ([]*Task, error)
	UpdateTask(ctx context.Context, t *Task) error
	// ClaimTask leases the oldest pending task matching c to c.Owner
	// atomically: concurrent claimers never lease the same task (SKIP
	// LOCKED on PostgreSQL, an immediate transaction on SQLite). It
	// returns ErrNotFound when there is none.
	ClaimTask(ctx context.Context, c TaskClaim) (*Task, error)
	// ExpireTaskLeases returns leased or running tasks whose lease ran out
	// to pending (attempts+1) or, past max_attempts, to failed. It returns
	// the tasks it changed, as changed.
	ExpireTaskLeases(ctx context.Context, now time.Time) ([]*Task, error)
	// ListInstancesWithAgentWork lists, once each, the instances that have
	// something for their agent's stream: a pending agent task, or a
	// leased or running one asked to cancel. It is the safety-net sweep
	// behind task notifications: one query for every stream of a replica.
	ListInstancesWithAgentWork(ctx context.Context) ([]InstanceID, error)
	// AgentWork is what a new agent stream asks about its instance: is an
	// agent task pending, and which leased or running ones are asked to
	// cancel. Every stream asks it once on connect, so it is three index
	// seeks in one statement, with no sort and no IN list (each of which
	// made SQLite build a temporary b-tree per call).
	AgentWork(ctx context.Context, instanceID InstanceID) (pending bool, cancels []*Task, err error)
}

// EventQueries keep the fleet events.
type EventQueries interface {
	// AppendEvent assigns e.ID and notifies ChannelEvents on commit. In a
	// transaction on PostgreSQL the event is written at commit (so that the
	// lock ordering event ids is taken after every row lock): e.ID is set
	// once Tx returns, not before.
	AppendEvent(ctx context.Context, e *Event) error
	// AppendEvents appends es in order, as AppendEvent would one by one,
	// with a single notification: a transaction recording many events
	// (a batch of pool claims) pays the per-append overhead once.
	AppendEvents(ctx context.Context, es []*Event) error
	// ListEvents is newest first; Page.After is an event id.
	ListEvents(ctx context.Context, f EventFilter, p Page) ([]*Event, error)
	// ListEventsSince is oldest first: events with id > afterID.
	ListEventsSince(ctx context.Context, f EventFilter, afterID int64, limit int) ([]*Event, error)
	// LatestEventID is where a watcher of new events starts: no event at
	// or below it can still appear. It is 0 when there are none.
	LatestEventID(ctx context.Context) (int64, error)
	// PruneEvents deletes low/medium events older than lowBefore and
	// high/critical ones older than highBefore, the oldest first, at most
	// limit of them (all when limit <= 0). Retention calls it in batches,
	// one transaction each, so that a large backlog never holds the
	// store's writer for long.
	PruneEvents(ctx context.Context, lowBefore, highBefore time.Time, limit int) (int64, error)
}

// RetentionQueries prune what no longer matters.
type RetentionQueries interface {
	// PruneRecords deletes what no longer matters past the cut-offs, at
	// most limit rows of each kind (all when limit <= 0): finished tasks
	// last updated before tasksBefore, tokens that expired before
	// tokensBefore (a spent token is refused anyway once expired), and
	// certificates that expired before certsBefore (revocation checks only
	// need unexpired ones).
	PruneRecords(ctx context.Context, tasksBefore, tokensBefore, certsBefore time.Time, limit int) (Pruned, error)
}

// DHCPQueries keep the leases of tetherd's own DHCP server (full mode).
// The store refuses (ErrAlreadyExists) a second lease of an address or a
// second address for a machine, so replicas racing cannot lease one twice.
type DHCPQueries interface {
	GetDHCPLeaseByMAC(ctx context.Context, mac string) (*DHCPLease, error)
	GetDHCPLeaseByIP(ctx context.Context, ip string) (*DHCPLease, error)
	// ListDHCPLeases lists every lease, expired ones too, by address.
	ListDHCPLeases(ctx context.Context) ([]*DHCPLease, error)
	CreateDHCPLease(ctx context.Context, l *DHCPLease) error
	// UpdateDHCPLease sets the expiry of mac's lease of l.IP.
	UpdateDHCPLease(ctx context.Context, l *DHCPLease) error
	// DeleteDHCPLease removes the lease of ip, if any.
	DeleteDHCPLease(ctx context.Context, ip string) error
}

// Pruned counts what PruneRecords deleted.
type Pruned struct {
	Tasks, Tokens, Certificates int64
}

// ErrTokenUsed and ErrTokenExpired are wrapped in ErrConflict by ConsumeToken.
var (
	ErrTokenUsed    = errors.New("token already used")
	ErrTokenExpired = errors.New("token expired")
)
