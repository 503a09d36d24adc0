package events

import (
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
)

// Payload is an event's kind-specific JSON object: one of the structs
// below, one per kind or per shape a few kinds share (docs/adr/0050). A
// writer fills named fields, so it cannot misspell a key or put a value
// of the wrong type under it.
//
// The stored JSON is what the maps these structs replaced produced, byte
// for byte: encoding/json sorted a map's keys, so each struct declares
// its fields in sorted JSON-name order; a key the map always wrote has no
// omitempty, even where it may be empty, and a key it wrote only under a
// condition has omitempty exactly where that condition was "not the zero
// value" (payload_test.go holds each against its map form). A new field
// goes in its sorted place.
type Payload interface{ payload() }

// Certificates and enrollment.

// EnrolledPayload: enroll.succeeded and enroll.retried by bootstrap token.
type EnrolledPayload struct {
	NotAfter string           `json:"not_after"`
	Serial   store.CertSerial `json:"serial"`
}

// AttestedPayload: enroll.succeeded by TPM attestation.
type AttestedPayload struct {
	Attested bool             `json:"attested"`
	EK       string           `json:"ek"`
	EventLog bool             `json:"event_log"`
	Events   int              `json:"events"`
	NotAfter string           `json:"not_after"`
	Serial   store.CertSerial `json:"serial"`
}

// RenewedPayload: certificate.renewed.
type RenewedPayload struct {
	Serial store.CertSerial `json:"serial"`
}

// RefusedPayload: the first enroll.token_reused or enroll.refused of a
// window; UsedAt is the spent token's use, when it has one.
type RefusedPayload struct {
	Count  int    `json:"count"`
	UsedAt string `json:"used_at,omitempty"`
}

// EKMovedPayload: the first enroll.ek_mismatch of a window for an EK
// bound to another node (BoundTo); Registered is the node's own EKs.
type EKMovedPayload struct {
	BoundTo    string   `json:"bound_to"`
	Count      int      `json:"count"`
	EK         string   `json:"ek"`
	Node       string   `json:"node"`
	Registered []string `json:"registered"`
}

// EKChangedPayload: the first enroll.ek_mismatch of a window for an EK
// bound to no node, from a node with others registered.
type EKChangedPayload struct {
	Count      int      `json:"count"`
	EK         string   `json:"ek"`
	Node       string   `json:"node"`
	Registered []string `json:"registered"`
}

// AttestRefusedPayload: the first enroll.refused of a window of an
// attested enrollment, for a reason that names no other machine.
type AttestRefusedPayload struct {
	Attested bool   `json:"attested"`
	Count    int    `json:"count"`
	EK       string `json:"ek"`
}

// MeasuredBootRefusedPayload: the first enroll.refused of a window by the
// measured-boot policy: what the template expected, what was booted.
type MeasuredBootRefusedPayload struct {
	Attested     bool     `json:"attested"`
	Booted       []string `json:"booted"`
	Count        int      `json:"count"`
	EK           string   `json:"ek"`
	Expected     string   `json:"expected"`
	MeasuredBoot bool     `json:"measured_boot"`
	SecureBoot   bool     `json:"secure_boot"`
	Template     string   `json:"template"`
}

// CoalescedPayload: what an enrollment refusal window held back.
type CoalescedPayload struct {
	Coalesced bool   `json:"coalesced"`
	Count     int    `json:"count"`
	First     string `json:"first"`
	Last      string `json:"last"`
}

// CertRevokedPayload: certificate.revoked of one certificate by an operator.
type CertRevokedPayload struct {
	By     string           `json:"by"`
	Serial store.CertSerial `json:"serial"`
}

// IdentityIssuedPayload: certificate.issued to an admin identity.
type IdentityIssuedPayload struct {
	By       string           `json:"by"`
	Identity string           `json:"identity"`
	Role     store.Role       `json:"role"`
	Serial   store.CertSerial `json:"serial"`
}

// IdentityRevokedPayload: certificate.revoked of every certificate of a
// revoked admin identity.
type IdentityRevokedPayload struct {
	By       string             `json:"by"`
	Identity string             `json:"identity"`
	Serial   store.CertSerial   `json:"serial"`
	Serials  []store.CertSerial `json:"serials"`
}

// IdentityRotatedPayload: certificate.revoked of an identity's earlier
// certificates when `tetherd init --rotate-admin` replaced it.
type IdentityRotatedPayload struct {
	By       string             `json:"by"`
	Identity string             `json:"identity"`
	Serials  []store.CertSerial `json:"serials"`
}

// CA rotation.

// CAPreparedPayload: ca.prepared.
type CAPreparedPayload struct {
	Active      string `json:"active"`
	By          string `json:"by"`
	Fingerprint string `json:"fingerprint"`
}

// CAActivatedPayload: ca.activated; Old is the CA it replaced ("" if none).
type CAActivatedPayload struct {
	By          string `json:"by"`
	Fingerprint string `json:"fingerprint"`
	Old         string `json:"old"`
}

// CARetiredPayload: ca.retired; Was is the state it left.
type CARetiredPayload struct {
	By          string `json:"by"`
	Fingerprint string `json:"fingerprint"`
	Was         string `json:"was"`
}

// CAAdoptedPayload: ca.adopted, with the certificates recorded before.
type CAAdoptedPayload struct {
	Certificates int    `json:"certificates"`
	Fingerprint  string `json:"fingerprint"`
}

// Nodes.

// NodeAdoptedPayload: node.adopted.
type NodeAdoptedPayload struct {
	Announced bool   `json:"announced"`
	Created   bool   `json:"created"`
	EK        string `json:"ek"`
	MAC       string `json:"mac"`
	Node      string `json:"node"`
}

// EKConflictPayload: node.ek_conflict.
type EKConflictPayload struct {
	BoundNode string `json:"bound_node"`
	EKHash    string `json:"ek_hash"`
	Node      string `json:"node"`
}

// MACGeneratedPayload: node.mac_generated.
type MACGeneratedPayload struct {
	MAC  string `json:"mac"`
	Node string `json:"node"`
}

// BMCTLSUnverifiedPayload: bmc.tls_unverified.
type BMCTLSUnverifiedPayload struct {
	Node string `json:"node"`
}

// Modules.

// ModulePushedPayload: module.pushed.
type ModulePushedPayload struct {
	Digest  string `json:"digest"`
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	Version string `json:"version"`
}

// ModuleDeletedPayload: module.deleted.
type ModuleDeletedPayload struct {
	Digest  string `json:"digest"`
	Name    string `json:"name"`
	Version string `json:"version"`
}

// ModuleSignedPayload: module.signed.
type ModuleSignedPayload struct {
	Digest  string `json:"digest"`
	Name    string `json:"name"`
	Signer  string `json:"signer"`
	Version string `json:"version"`
}

// Tasks.

// AgentTaskFinishedPayload: task.finished of an agent's task.
type AgentTaskFinishedPayload struct {
	Error    string           `json:"error"`
	ExitCode *int             `json:"exit_code"`
	Status   store.TaskStatus `json:"status"`
}

// WorkerTaskFinishedPayload: task.finished of a worker's task.
type WorkerTaskFinishedPayload struct {
	Error  string           `json:"error"`
	Status store.TaskStatus `json:"status"`
	Target store.TaskTarget `json:"target"`
}

// Instances.

// ProvisionedPayload: instance.provisioned; PoolID is set for a pool
// member only.
type ProvisionedPayload struct {
	Node        string       `json:"node"`
	OperationID string       `json:"operation_id"`
	PoolID      store.PoolID `json:"pool_id,omitempty"`
	Provider    string       `json:"provider"`
}

// TokenIssuedPayload: token.issued; Superseded counts the unused tokens
// it ended, when there were any.
type TokenIssuedPayload struct {
	ExpiresAt  string `json:"expires_at"`
	Superseded int    `json:"superseded,omitempty"`
}

// TransitionPayload: instance.transition.
type TransitionPayload struct {
	Event  string `json:"event"`
	From   string `json:"from"`
	Reason string `json:"reason"`
	To     string `json:"to"`
}

// AgentErrorPayload: instance.agent_error and an agent's instance.errored.
type AgentErrorPayload struct {
	Error string `json:"error"`
	Phase string `json:"phase"`
}

// HeldPayload: instance.held.
type HeldPayload struct {
	By     string `json:"by"`
	Reason string `json:"reason"`
}

// UnheldPayload: instance.unheld; Was is the hold's reason.
type UnheldPayload struct {
	By  string `json:"by"`
	Was string `json:"was"`
}

// CordonedPayload: instance.cordoned.
type CordonedPayload struct {
	By              string              `json:"by"`
	CordonState     string              `json:"cordon_state"`
	PoolStateBefore lifecycle.PoolState `json:"pool_state_before"`
	Reason          string              `json:"reason"`
}

// UncordonedPayload: instance.uncordoned; Was is the cordon's reason.
type UncordonedPayload struct {
	By            string `json:"by"`
	UncordonState string `json:"uncordon_state"`
	Was           string `json:"was"`
}

// MachineCreatedPayload: instance.machine_created.
type MachineCreatedPayload struct {
	Machine  string `json:"machine"`
	Provider string `json:"provider"`
	State    string `json:"state"`
}

// MachineDestroyedPayload: instance.machine_destroyed.
type MachineDestroyedPayload struct {
	Error   string `json:"error"`
	Machine string `json:"machine"`
}

// AnswerLostPayload: instance.provider_answer_lost.
type AnswerLostPayload struct {
	Error    string `json:"error"`
	Observed string `json:"observed"`
	Op       string `json:"op"`
}

// ProviderFailedPayload: instance.provider_failed of a power operation,
// with what the provider showed after.
type ProviderFailedPayload struct {
	Error    string `json:"error"`
	Kind     string `json:"kind"`
	Observed string `json:"observed"`
	Op       string `json:"op"`
	Provider string `json:"provider"`
}

// ProvisionFailedPayload: instance.provider_failed of a provision.
type ProvisionFailedPayload struct {
	Error    string `json:"error"`
	Kind     string `json:"kind"`
	Op       string `json:"op"`
	Provider string `json:"provider"`
}

// ProvisionAbandonedPayload: instance.provider_failed of a provision
// given up without a provider error of its own.
type ProvisionAbandonedPayload struct {
	Op       string `json:"op"`
	Provider string `json:"provider"`
}

// MachineExitedPayload: instance.errored of a machine the provider shows
// exited or gone (Source says who looked).
type MachineExitedPayload struct {
	Detail   string `json:"detail"`
	Machine  string `json:"machine"`
	Observed string `json:"observed"`
	Provider string `json:"provider"`
	Source   string `json:"source"`
}

// GuestPresentPayload: instance.terminated_guest_present.
type GuestPresentPayload struct {
	Destroyed bool   `json:"destroyed"`
	Error     string `json:"error"`
	Machine   string `json:"machine"`
	Provider  string `json:"provider"`
	State     string `json:"state"`
}

// TerminateRequestedPayload: instance.terminate_requested.
type TerminateRequestedPayload struct {
	Machine string          `json:"machine"`
	Status  lifecycle.State `json:"status"`
}

// TerminateFailedPayload: instance.terminate_failed.
type TerminateFailedPayload struct {
	Error    string `json:"error"`
	Kind     string `json:"kind"`
	Machine  string `json:"machine"`
	Observed string `json:"observed"`
	Provider string `json:"provider"`
}

// TerminatedPayload: instance.terminated.
type TerminatedPayload struct {
	Machine        string             `json:"machine"`
	Revoked        []store.CertSerial `json:"revoked"`
	TasksCancelled int                `json:"tasks_cancelled"`
	TokensExpired  int                `json:"tokens_expired"`
}

// SilentPayload: instance.silent.
type SilentPayload struct {
	LastHeartbeatAt string `json:"last_heartbeat_at"`
}

// PresumedDeadPayload: instance.presumed_dead.
type PresumedDeadPayload struct {
	LastHeartbeatAt string `json:"last_heartbeat_at"`
	Observed        string `json:"observed"`
}

// BootTimeoutPayload: instance.boot_timeout of a boot that did not end.
type BootTimeoutPayload struct {
	AgentError string          `json:"agent_error"`
	AgentPhase string          `json:"agent_phase"`
	Status     lifecycle.State `json:"status"`
}

// SwitchTimeoutPayload: instance.boot_timeout of a switch into the
// installed system that did not end.
type SwitchTimeoutPayload struct {
	AgentPhase    string          `json:"agent_phase"`
	Status        lifecycle.State `json:"status"`
	SwitchTimeout string          `json:"switch_timeout"`
}

// Netboot.

// ScriptServedPayload: netboot.script_served.
type ScriptServedPayload struct {
	Remote string `json:"remote"`
	Status string `json:"status"`
}

// ScriptRefusedPayload: netboot.script_refused, the first of a window.
type ScriptRefusedPayload struct {
	Count  int    `json:"count"`
	Reason string `json:"reason"`
	Remote string `json:"remote"`
	Status int    `json:"status"`
}

// ScriptRefusalsPayload: what a netboot.script_refused window held back.
type ScriptRefusalsPayload struct {
	Coalesced bool   `json:"coalesced"`
	Count     int    `json:"count"`
	First     string `json:"first"`
	Last      string `json:"last"`
	Reason    string `json:"reason"`
	Remote    string `json:"remote"`
	Status    int    `json:"status"`
}

// UKIServedPayload: netboot.uki_served.
type UKIServedPayload struct {
	Digest   string `json:"digest"`
	MAC      string `json:"mac"`
	Remote   string `json:"remote"`
	Signed   bool   `json:"signed"`
	Template string `json:"template"`
}

// MachineRefusedPayload: netboot.refused of one request; Reason is one of
// the Refused* codes.
type MachineRefusedPayload struct {
	MAC    string `json:"mac"`
	Reason string `json:"reason"`
	Remote string `json:"remote"`
}

// SourceRefusalsPayload: what a netboot.refused or netboot.announced
// window held back from one sender.
type SourceRefusalsPayload struct {
	Coalesced bool   `json:"coalesced"`
	Count     int    `json:"count"`
	First     string `json:"first"`
	Last      string `json:"last"`
	Remote    string `json:"remote"`
}

// AllSourcesRefusalsPayload: what a window held back over every sender;
// AllSources is always true.
type AllSourcesRefusalsPayload struct {
	AllSources bool   `json:"all_sources"`
	Coalesced  bool   `json:"coalesced"`
	Count      int    `json:"count"`
	First      string `json:"first"`
	Last       string `json:"last"`
}

// AnnouncedPayload: netboot.announced. catalog reads it back to adopt a
// machine.
type AnnouncedPayload struct {
	EK                  string `json:"ek"`
	EKCertificate       bool   `json:"ek_certificate"`
	EKCertificateIssuer string `json:"ek_certificate_issuer,omitempty"`
	MAC                 string `json:"mac"`
	Remote              string `json:"remote"`
}

// Pools.

// ClaimPayload is who holds which member of which pool: pool.claimed
// carries it, and the other claim events repeat it, so that "who held
// what for how long" is one query on one kind. AcquiredAt is set while
// the member has an acquisition time.
type ClaimPayload struct {
	AcquiredAt  string           `json:"acquired_at,omitempty"`
	AcquiredBy  string           `json:"acquired_by"`
	AcquiredFor string           `json:"acquired_for"`
	ClaimID     store.ClaimID    `json:"claim_id"`
	InstanceID  store.InstanceID `json:"instance_id"`
	PoolID      store.PoolID     `json:"pool_id"`
	PoolName    string           `json:"pool_name"`
}

// ClaimReleasedPayload: pool.released; Error is the failure behind an
// errored disposition.
type ClaimReleasedPayload struct {
	AcquiredAt  string           `json:"acquired_at,omitempty"`
	AcquiredBy  string           `json:"acquired_by"`
	AcquiredFor string           `json:"acquired_for"`
	ClaimID     store.ClaimID    `json:"claim_id"`
	Disposition string           `json:"disposition"`
	Error       string           `json:"error,omitempty"`
	HeldSeconds int64            `json:"held_seconds"`
	InstanceID  store.InstanceID `json:"instance_id"`
	PoolID      store.PoolID     `json:"pool_id"`
	PoolName    string           `json:"pool_name"`
	ReleasedAt  string           `json:"released_at"`
}

// Released is the pool.released payload closing c.
func (c ClaimPayload) Released(disposition, failure string, heldSeconds int64, releasedAt string) ClaimReleasedPayload {
	return ClaimReleasedPayload{AcquiredAt: c.AcquiredAt, AcquiredBy: c.AcquiredBy, AcquiredFor: c.AcquiredFor, ClaimID: c.ClaimID,
		Disposition: disposition, Error: failure, HeldSeconds: heldSeconds, InstanceID: c.InstanceID, PoolID: c.PoolID,
		PoolName: c.PoolName, ReleasedAt: releasedAt}
}

// ClaimStalePayload: pool.claimed_stale.
type ClaimStalePayload struct {
	AcquiredAt        string           `json:"acquired_at,omitempty"`
	AcquiredBy        string           `json:"acquired_by"`
	AcquiredFor       string           `json:"acquired_for"`
	ClaimID           store.ClaimID    `json:"claim_id"`
	ClaimedTTLSeconds int64            `json:"claimed_ttl_seconds"`
	HeldSeconds       int64            `json:"held_seconds"`
	InstanceID        store.InstanceID `json:"instance_id"`
	PoolID            store.PoolID     `json:"pool_id"`
	PoolName          string           `json:"pool_name"`
}

// Stale is the pool.claimed_stale payload of c.
func (c ClaimPayload) Stale(heldSeconds, claimedTTLSeconds int64) ClaimStalePayload {
	return ClaimStalePayload{AcquiredAt: c.AcquiredAt, AcquiredBy: c.AcquiredBy, AcquiredFor: c.AcquiredFor, ClaimID: c.ClaimID,
		ClaimedTTLSeconds: claimedTTLSeconds, HeldSeconds: heldSeconds, InstanceID: c.InstanceID, PoolID: c.PoolID, PoolName: c.PoolName}
}

// ClaimSilentPayload: pool.claimed_stale_heartbeat_flagged.
type ClaimSilentPayload struct {
	AcquiredAt      string           `json:"acquired_at,omitempty"`
	AcquiredBy      string           `json:"acquired_by"`
	AcquiredFor     string           `json:"acquired_for"`
	ClaimID         store.ClaimID    `json:"claim_id"`
	InstanceID      store.InstanceID `json:"instance_id"`
	LastHeartbeatAt string           `json:"last_heartbeat_at"`
	PoolID          store.PoolID     `json:"pool_id"`
	PoolName        string           `json:"pool_name"`
}

// Silent is the pool.claimed_stale_heartbeat_flagged payload of c.
func (c ClaimPayload) Silent(lastHeartbeatAt string) ClaimSilentPayload {
	return ClaimSilentPayload{AcquiredAt: c.AcquiredAt, AcquiredBy: c.AcquiredBy, AcquiredFor: c.AcquiredFor, ClaimID: c.ClaimID,
		InstanceID: c.InstanceID, LastHeartbeatAt: lastHeartbeatAt, PoolID: c.PoolID, PoolName: c.PoolName}
}

// MemberReadyPayload: pool.member_ready.
type MemberReadyPayload struct {
	PoolState   lifecycle.PoolState `json:"pool_state"`
	WarmSeconds int64               `json:"warm_seconds"`
}

// ReadyStaleHeartbeatPayload: pool.ready_stale_heartbeat_recycled.
type ReadyStaleHeartbeatPayload struct {
	LastHeartbeatAt   string `json:"last_heartbeat_at"`
	StaleAfterSeconds int64  `json:"stale_after_seconds"`
}

// DrainFailedPayload: pool.terminate_failed of a drain; Errors maps each
// failed instance id to its error.
type DrainFailedPayload struct {
	Drained           int                `json:"drained"`
	During            string             `json:"during"`
	Errors            map[string]string  `json:"errors"`
	FailedInstanceIDs []store.InstanceID `json:"failed_instance_ids"`
	TerminateFailed   int                `json:"terminate_failed"`
}

// TerminateFailuresPayload: pool.terminate_failed of one member.
type TerminateFailuresPayload struct {
	During            string             `json:"during"`
	Error             string             `json:"error"`
	FailedInstanceIDs []store.InstanceID `json:"failed_instance_ids"`
}

// TerminateAbandonedPayload: pool.terminate_abandoned.
type TerminateAbandonedPayload struct {
	Attempts int    `json:"attempts"`
	Error    string `json:"error"`
	Machine  string `json:"machine"`
}

// Control plane.

// RestoredPayload: controlplane.restored. Its fields are in the order the
// hand-written JSON it replaced had them, not sorted: the stored text
// stays the same.
type RestoredPayload struct {
	BackupCreatedAt string `json:"backup_created_at"`
	RestoredAt      string `json:"restored_at"`
	KeysOnly        bool   `json:"keys_only"`
	MissingBlobs    int    `json:"missing_blobs"`
}

func (EnrolledPayload) payload()            {}
func (AttestedPayload) payload()            {}
func (RenewedPayload) payload()             {}
func (RefusedPayload) payload()             {}
func (EKMovedPayload) payload()             {}
func (EKChangedPayload) payload()           {}
func (AttestRefusedPayload) payload()       {}
func (MeasuredBootRefusedPayload) payload() {}
func (CoalescedPayload) payload()           {}
func (CertRevokedPayload) payload()         {}
func (IdentityIssuedPayload) payload()      {}
func (IdentityRevokedPayload) payload()     {}
func (IdentityRotatedPayload) payload()     {}
func (CAPreparedPayload) payload()          {}
func (CAActivatedPayload) payload()         {}
func (CARetiredPayload) payload()           {}
func (CAAdoptedPayload) payload()           {}
func (NodeAdoptedPayload) payload()         {}
func (EKConflictPayload) payload()          {}
func (MACGeneratedPayload) payload()        {}
func (BMCTLSUnverifiedPayload) payload()    {}
func (ModulePushedPayload) payload()        {}
func (ModuleDeletedPayload) payload()       {}
func (ModuleSignedPayload) payload()        {}
func (AgentTaskFinishedPayload) payload()   {}
func (WorkerTaskFinishedPayload) payload()  {}
func (ProvisionedPayload) payload()         {}
func (TokenIssuedPayload) payload()         {}
func (TransitionPayload) payload()          {}
func (AgentErrorPayload) payload()          {}
func (HeldPayload) payload()                {}
func (UnheldPayload) payload()              {}
func (CordonedPayload) payload()            {}
func (UncordonedPayload) payload()          {}
func (MachineCreatedPayload) payload()      {}
func (MachineDestroyedPayload) payload()    {}
func (AnswerLostPayload) payload()          {}
func (ProviderFailedPayload) payload()      {}
func (ProvisionFailedPayload) payload()     {}
func (ProvisionAbandonedPayload) payload()  {}
func (MachineExitedPayload) payload()       {}
func (GuestPresentPayload) payload()        {}
func (TerminateRequestedPayload) payload()  {}
func (TerminateFailedPayload) payload()     {}
func (TerminatedPayload) payload()          {}
func (SilentPayload) payload()              {}
func (PresumedDeadPayload) payload()        {}
func (BootTimeoutPayload) payload()         {}
func (SwitchTimeoutPayload) payload()       {}
func (ScriptServedPayload) payload()        {}
func (ScriptRefusedPayload) payload()       {}
func (ScriptRefusalsPayload) payload()      {}
func (UKIServedPayload) payload()           {}
func (MachineRefusedPayload) payload()      {}
func (SourceRefusalsPayload) payload()      {}
func (AllSourcesRefusalsPayload) payload()  {}
func (AnnouncedPayload) payload()           {}
func (ClaimPayload) payload()               {}
func (ClaimReleasedPayload) payload()       {}
func (ClaimStalePayload) payload()          {}
func (ClaimSilentPayload) payload()         {}
func (MemberReadyPayload) payload()         {}
func (ReadyStaleHeartbeatPayload) payload() {}
func (DrainFailedPayload) payload()         {}
func (TerminateFailuresPayload) payload()   {}
func (TerminateAbandonedPayload) payload()  {}
func (RestoredPayload) payload()            {}
