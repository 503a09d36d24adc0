package store

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
)

// Template is what a node boots.
type Template struct {
	ID   TemplateID
	Name string
	// RootModules are bottom first.
	RootModules      []ModuleRef
	ExtensionModules []ModuleRef
	KernelDigest     string
	InitramfsDigest  string
	KernelArgs       string
	// Console is the console= value, "none", or "" for DefaultConsole.
	Console              string
	RequireSignedModules bool
	// RequiredSigners are signer fingerprints (sha256:HEX); every module
	// needs a valid signature by at least one of them.
	RequiredSigners []string
	// RequireAttestation refuses token enrollment for the instances of
	// every node of the template.
	RequireAttestation   bool
	CreatedAt, UpdatedAt time.Time
}

// DefaultConsole is a template's console unless it names another: the
// first serial port, so that a netbooted machine's console is never silent.
const DefaultConsole = "ttyS0"

// ConsoleNone asks for no console= parameter at all.
const ConsoleNone = "none"

// ConsoleArg is the kernel parameter for the template's console, "" for
// ConsoleNone.
func (t *Template) ConsoleArg() string {
	switch t.Console {
	case ConsoleNone:
		return ""
	case "":
		return "console=" + DefaultConsole
	}
	return "console=" + t.Console
}

// ModuleRef names a module version.
type ModuleRef struct {
	Name    string
	Version string
}

// Module is an immutable, content-addressed erofs image.
type Module struct {
	Name    string
	Version string
	Digest  string // sha256:<hex>
	Size    int64
	// Signature is the single unverified signature older versions stored;
	// new pushes record verified Signatures instead.
	Signature []byte
	CreatedAt time.Time
	// Signatures are verified at push or at sign time, one per signer.
	Signatures []ModuleSignature
}

// ModuleSignature is one signer's signature over a module.
type ModuleSignature struct {
	Signer     string // sha256:HEX over PublicKey
	SignerName string
	PublicKey  []byte
	Signature  []byte
	CreatedAt  time.Time
}

// Signer is a registered module signing key.
type Signer struct {
	Name        string
	Fingerprint string
	PublicKey   []byte
	CreatedAt   time.Time
}

// AdminIdentity is an operator identity minted by the control plane.
type AdminIdentity struct {
	Name      string
	Role      Role
	Serial    CertSerial // the current certificate
	NotAfter  time.Time
	CreatedAt time.Time
	RevokedAt time.Time // zero while active
}

// AuditRecord is who did what to which target, and how it ended.
type AuditRecord struct {
	ID       int64
	At       time.Time
	Identity string
	Role     Role
	Serial   CertSerial
	Method   string
	Target   string
	Code     string
}

// AuditFilter narrows ListAudit.
type AuditFilter struct {
	Identity string
	Since    time.Time
	AfterID  int64
	Limit    int
}

// Node is a logical host; it outlives its instances.
type Node struct {
	ID            NodeID
	Name          string
	TemplateID    TemplateID
	Enabled       bool
	Config        json.RawMessage // a JSON object
	PublicAddress string
	// MACs are the hardware addresses of the machine's NICs, normalised
	// (macaddr.Normalize); each belongs to one node at most.
	MACs []string
	// EKHashes are the SHA-256 of the public keys of the TPM endorsement
	// keys the machine may present (sha256:HEX, lower case); each belongs
	// to one node at most.
	EKHashes []string
	// RequireAttestation refuses token enrollment for the node's
	// instances: only a TPM-attested enrollment may name them.
	RequireAttestation bool
	// BMC is the node's baseboard management controller; zero when
	// something else powers the machine.
	BMC       NodeBMC
	CreatedAt time.Time
	UpdatedAt time.Time
}

// NodeBMC is how the control plane reaches a node's BMC (the redfish
// provider). It names a credential, never holds one.
type NodeBMC struct {
	// Address is redfish://HOST[:PORT]/redfish/v1/Systems/ID; "" for none.
	Address    string
	Credential string
	// CAPEM verifies the BMC's certificate chain; Fingerprint pins its
	// certificate (sha256:HEX); Insecure skips verification (labs).
	CAPEM       string
	Fingerprint string
	Insecure    bool
	// BootMode is the boot override mode: "UEFI", "Legacy" or "" (the BMC's).
	BootMode string
}

// Credential is a stored BMC credential. Sealed is the password as the
// control plane encrypted it; the store never sees it in the clear.
type Credential struct {
	Name      string
	Username  string
	Sealed    []byte
	CreatedAt time.Time
	UpdatedAt time.Time
}

// MACInUseError is the ErrAlreadyExists a node write gets when one of its
// hardware addresses belongs to another node.
type MACInUseError struct {
	MAC, Node string
}

func (e *MACInUseError) Error() string {
	return fmt.Sprintf("hardware address %s already belongs to node %q", e.MAC, e.Node)
}

// Is makes errors.Is(err, ErrAlreadyExists) hold.
func (e *MACInUseError) Is(target error) bool { return target == ErrAlreadyExists }

// EKInUseError is the ErrAlreadyExists a node write gets when one of its
// EK hashes belongs to another node: one TPM is one machine, so binding it
// twice would let either node's enrollment stand for the other.
type EKInUseError struct {
	EK, Node string
}

func (e *EKInUseError) Error() string {
	return fmt.Sprintf("endorsement key %s already belongs to node %q", e.EK, e.Node)
}

// Is makes errors.Is(err, ErrAlreadyExists) hold.
func (e *EKInUseError) Is(target error) bool { return target == ErrAlreadyExists }

// EnrollGate is what a token enrollment must know of its instance, read
// in the transaction that spends the token.
type EnrollGate struct {
	Status lifecycle.State
	// NodeRequiresAttestation and TemplateRequiresAttestation are the
	// require_attestation of the instance's node and of its template.
	NodeRequiresAttestation     bool
	TemplateRequiresAttestation bool
}

// DHCPLease is an address tetherd's DHCP server leased to a machine.
type DHCPLease struct {
	IP        string // dotted IPv4
	MAC       string // normalised
	ExpiresAt time.Time
	UpdatedAt time.Time
}

// NodeFilter narrows ListNodes.
type NodeFilter struct {
	TemplateID TemplateID
	// HasBMC matches nodes with a BMC address.
	HasBMC bool
}

// Cordon is the marker cordon writes (docs/design.md §2.9).
type Cordon struct {
	By              string
	Reason          string
	At              time.Time
	PoolStateBefore lifecycle.PoolState
}

// Instance is one machine incarnation of a node. Its row carries four
// kinds of data besides the machine's own; each is an embedded part, so
// that a reader sees which fields move together while inst.PoolID and the
// like still read as before.
type Instance struct {
	ID              InstanceID
	NodeID          NodeID
	Status          lifecycle.State
	Provider        string
	Region          string
	InstanceType    string
	CloudInstanceID string
	OperationID     string

	PoolMember
	Holds
	AgentReport
	Termination

	ErrorMessage string
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

// PoolMember is an instance's place in a pool (docs/design.md §4); zero
// for an instance of no pool.
type PoolMember struct {
	PoolID               PoolID
	PoolState            lifecycle.PoolState
	PoolWarmingStartedAt *time.Time
	// PoolReadyAt anchors the ready TTL; reuse resets it.
	PoolReadyAt    *time.Time
	PoolAcquiredAt *time.Time
	ClaimID        ClaimID
	AcquiredBy     string
	AcquiredFor    string
	// Flags so that stale-claim events fire once per claim.
	ClaimedStaleFlagged   bool
	HeartbeatStaleFlagged bool
}

// Holds are what an operator sets to keep an instance from use: a hold
// and a cordon (docs/design.md §2.9).
type Holds struct {
	Hold       bool
	HoldReason string
	Cordon     *Cordon
}

// AgentReport is what the instance's agent last said (the coalesced
// heartbeats), and whether its silence was raised.
type AgentReport struct {
	LastHeartbeatAt *time.Time
	AgentPhase      string
	AgentVersion    string
	RunningModules  []string
	AgentError      string
	Addresses       []string
	BootID          string
	// SilentSince is set when instance.silent was raised, and cleared by the
	// next heartbeat, so the event fires once per silence.
	SilentSince *time.Time
}

// Termination is the way out: the recorded intent of a two-phase
// terminate, and the errored pool member's terminate ladder.
type Termination struct {
	// TerminateRequestedAt is the recorded intent of a two-phase terminate.
	TerminateRequestedAt *time.Time
	// The errored-member terminate ladder.
	PoolTerminateAttempts int
	PoolNextTerminateAt   *time.Time
}

// InstanceFilter narrows ListInstances and CountInstances. Zero fields
// match everything.
type InstanceFilter struct {
	NodeID     NodeID
	PoolID     PoolID
	Provider   string
	Statuses   []lifecycle.State
	PoolStates []lifecycle.PoolState
	// HeartbeatBefore matches instances whose last heartbeat (or, with
	// none yet, creation) is older than the time.
	HeartbeatBefore *time.Time
	// UpdatedBefore matches instances whose row last changed (a
	// transition, an agent error; not a heartbeat) before the time.
	UpdatedBefore *time.Time
	// AgentPhase matches instances whose agent last reported this phase
	// ("switching").
	AgentPhase string
	// TerminateRequested matches instances with a recorded terminate intent.
	TerminateRequested bool
	// OldestFirst orders by creation (default is by id, which is also
	// creation order for v7 ids).
	OldestFirst bool
}

// Heartbeat is one coalesced agent heartbeat.
type Heartbeat struct {
	InstanceID     InstanceID
	At             time.Time
	Phase          string
	AgentVersion   string
	RunningModules []string
	AgentError     string
	Addresses      []string
	BootID         string
}

// Token is a bootstrap token; only its hash is stored.
type Token struct {
	Hash       string
	InstanceID InstanceID
	ExpiresAt  time.Time
	UsedAt     *time.Time
	CreatedAt  time.Time
	// SpentKey is the key the enrollment that spent the token was for
	// (sha256:HEX of its SubjectPublicKeyInfo): a retry with the same
	// token and the same key is the same enrollment, whose answer was
	// lost on the way.
	SpentKey string
}

// Certificate is an issued identity.
type Certificate struct {
	Serial CertSerial
	// Issuer is the fingerprint of the CA that signed it.
	Issuer       string
	InstanceID   InstanceID
	Kind         CertKind
	Subject      string
	NotBefore    time.Time
	NotAfter     time.Time
	RevokedAt    *time.Time
	RevokeReason string
	CreatedAt    time.Time
}

// CA states of a rotation (docs/design.md §3.10), after SPIRE's
// prepared, active and old keys.
const (
	AuthorityPrepared = "prepared"
	AuthorityActive   = "active"
	AuthorityOld      = "old"
	AuthorityRetired  = "retired"
)

// Authority is one CA of the rotation set.
type Authority struct {
	Fingerprint string
	CertPEM     string
	// KeySealed is the CA key sealed under the data dir's
	// credentials.key; empty for the CA `tetherd init` made, whose key is
	// the data dir's ca/ca.key.
	KeySealed []byte
	// CrossPEM is this root signed by the CA that was active when it was
	// prepared: what lets an agent that trusts that one accept this one.
	CrossPEM  string
	State     string
	NotAfter  time.Time
	CreatedAt time.Time
	UpdatedAt time.Time
}

// CertificateFilter narrows ListCertificates.
type CertificateFilter struct {
	InstanceID InstanceID
	// Subject is the identity URI: every certificate an admin identity
	// was ever issued carries the same one.
	Subject string
}

// Task is a unit of work for an agent or a control-plane worker.
type Task struct {
	ID         TaskID
	Target     TaskTarget
	InstanceID InstanceID
	Kind       TaskKind
	// Payload is kind-specific JSON (exec: {"argv": [...], "timeout_seconds": N}).
	Payload         json.RawMessage
	Status          TaskStatus
	LeaseOwner      string
	LeaseExpiresAt  *time.Time
	Attempts        int
	MaxAttempts     int
	ExitCode        *int
	Output          []byte
	OutputTruncated bool
	ErrorMessage    string
	Progress        string
	// CancelRequested asks a running task's executor to stop.
	CancelRequested bool
	CreatedAt       time.Time
	UpdatedAt       time.Time
}

// Terminal reports whether the task has ended.
func (t *Task) Terminal() bool {
	return t.Status.Terminal()
}

// TaskFilter narrows ListTasks.
type TaskFilter struct {
	InstanceID InstanceID
	Target     TaskTarget
	Statuses   []TaskStatus
}

// TaskClaim asks for one pending task.
type TaskClaim struct {
	Target TaskTarget
	// InstanceID narrows to one instance's tasks (agents); empty means any.
	InstanceID InstanceID
	// TaskID narrows to one task (the push path leases the task it announces).
	TaskID     TaskID
	Owner      string
	Now        time.Time
	LeaseUntil time.Time
}

// Event is an append-only fleet event.
type Event struct {
	ID            int64
	Kind          EventKind
	Severity      Severity
	InstanceID    InstanceID
	PoolID        PoolID
	CorrelationID CorrelationID
	Message       string
	Payload       json.RawMessage // a JSON object
	CreatedAt     time.Time
}

// EventFilter narrows event reads.
type EventFilter struct {
	Kind          EventKind
	InstanceID    InstanceID
	PoolID        PoolID
	CorrelationID CorrelationID
	MinSeverity   Severity
}
