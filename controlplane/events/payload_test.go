package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
)

// payloadCase is one typed payload and the map its writer built before
// payloads were typed, with the values of the same Go types.
type payloadCase struct {
	name  string
	typed events.Payload
	old   map[string]any
}

func intp(n int) *int { return &n }

// attribution is what claims.Attribution wrote, acquired_at only when the
// member had an acquisition time.
func attribution(acquiredAt string) map[string]any {
	p := map[string]any{"claim_id": store.ClaimID("c-1"), "pool_id": store.PoolID("p-1"), "pool_name": "ci",
		"instance_id": store.InstanceID("i-1"), "acquired_by": "alice", "acquired_for": "tests"}
	if acquiredAt != "" {
		p["acquired_at"] = acquiredAt
	}
	return p
}

func with(m map[string]any, kv ...any) map[string]any {
	for i := 0; i < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

var claim = events.ClaimPayload{AcquiredAt: "2026-11-30T12:00:00Z", AcquiredBy: "alice", AcquiredFor: "tests", ClaimID: "c-1",
	InstanceID: "i-1", PoolID: "p-1", PoolName: "ci"}

// unacquired is a claim whose member had no acquisition time.
var unacquired = func() events.ClaimPayload { c := claim; c.AcquiredAt = ""; return c }()

var payloadCases = []payloadCase{
	{"enrolled", events.EnrolledPayload{NotAfter: "2026-12-01T00:00:00Z", Serial: "1f"},
		map[string]any{"serial": "1f", "not_after": "2026-12-01T00:00:00Z"}},
	{"attested", events.AttestedPayload{Attested: true, EK: "sha256:ab", EventLog: true, Events: 42, NotAfter: "2026-12-01T00:00:00Z", Serial: "1f"},
		map[string]any{"serial": "1f", "not_after": "2026-12-01T00:00:00Z", "attested": true, "ek": "sha256:ab", "event_log": true, "events": 42}},
	{"attested without a log", events.AttestedPayload{Attested: true, EK: "sha256:ab", NotAfter: "x", Serial: "1f"},
		map[string]any{"serial": "1f", "not_after": "x", "attested": true, "ek": "sha256:ab", "event_log": false, "events": 0}},
	{"renewed", events.RenewedPayload{Serial: "1f"}, map[string]any{"serial": "1f"}},
	{"token reused", events.RefusedPayload{Count: 1, UsedAt: "2026-11-30T12:00:00Z"},
		map[string]any{"used_at": "2026-11-30T12:00:00Z", "count": 1}},
	{"refused (no use time)", events.RefusedPayload{Count: 1}, map[string]any{"count": 1}},
	{"ek moved", events.EKMovedPayload{BoundTo: "n2", Count: 1, EK: "sha256:ab", Node: "n1", Registered: []string{"sha256:cd"}},
		map[string]any{"ek": "sha256:ab", "node": "n1", "bound_to": "n2", "registered": []string{"sha256:cd"}, "count": 1}},
	{"ek moved (none registered)", events.EKMovedPayload{BoundTo: "n2", Count: 1, EK: "sha256:ab", Node: "n1"},
		map[string]any{"ek": "sha256:ab", "node": "n1", "bound_to": "n2", "registered": []string(nil), "count": 1}},
	{"ek changed", events.EKChangedPayload{Count: 1, EK: "sha256:ab", Node: "n1", Registered: []string{"sha256:cd", "sha256:ef"}},
		map[string]any{"ek": "sha256:ab", "node": "n1", "registered": []string{"sha256:cd", "sha256:ef"}, "count": 1}},
	{"attestation refused", events.AttestRefusedPayload{Attested: true, Count: 1, EK: "sha256:ab"},
		map[string]any{"ek": "sha256:ab", "attested": true, "count": 1}},
	{"measured boot refused", events.MeasuredBootRefusedPayload{Attested: true, Booted: []string{"aa", "bb"}, Count: 1, EK: "sha256:ab",
		Expected: "sha256:cc", MeasuredBoot: true, SecureBoot: false, Template: "t"},
		map[string]any{"ek": "sha256:ab", "attested": true, "measured_boot": true, "template": "t", "expected": "sha256:cc",
			"booted": []string{"aa", "bb"}, "secure_boot": false, "count": 1}},
	{"measured boot refused (nothing booted)", events.MeasuredBootRefusedPayload{Attested: true, Count: 1, MeasuredBoot: true},
		map[string]any{"ek": "", "attested": true, "measured_boot": true, "template": "", "expected": "",
			"booted": []string(nil), "secure_boot": false, "count": 1}},
	{"enrollment refusals coalesced", events.CoalescedPayload{Coalesced: true, Count: 7, First: "a", Last: "b"},
		map[string]any{"count": 7, "coalesced": true, "first": "a", "last": "b"}},
	{"certificate revoked", events.CertRevokedPayload{By: "ann", Serial: "1f"},
		map[string]any{"serial": store.CertSerial("1f"), "by": "ann"}},
	{"identity issued", events.IdentityIssuedPayload{By: "ann", Identity: "bob", Role: store.RoleOperator, Serial: "1f"},
		map[string]any{"identity": "bob", "role": store.RoleOperator, "serial": store.CertSerial("1f"), "by": "ann"}},
	{"identity revoked", events.IdentityRevokedPayload{By: "ann", Identity: "bob", Serial: "2", Serials: []store.CertSerial{"1", "2"}},
		map[string]any{"identity": "bob", "serial": store.CertSerial("2"), "serials": []store.CertSerial{"1", "2"}, "by": "ann"}},
	{"identity rotated", events.IdentityRotatedPayload{By: "tetherd init --rotate-admin", Identity: "admin", Serials: []store.CertSerial{"1"}},
		map[string]any{"identity": "admin", "serials": []store.CertSerial{"1"}, "by": "tetherd init --rotate-admin"}},
	{"identity rotated (none)", events.IdentityRotatedPayload{},
		map[string]any{"identity": "", "serials": []store.CertSerial(nil), "by": ""}},
	{"ca prepared", events.CAPreparedPayload{Active: "aa", By: "ann", Fingerprint: "bb"},
		map[string]any{"fingerprint": "bb", "active": "aa", "by": "ann"}},
	{"ca activated (no old)", events.CAActivatedPayload{By: "ann", Fingerprint: "bb"},
		map[string]any{"fingerprint": "bb", "old": "", "by": "ann"}},
	{"ca retired", events.CARetiredPayload{By: "ann", Fingerprint: "aa", Was: store.AuthorityOld},
		map[string]any{"fingerprint": "aa", "was": store.AuthorityOld, "by": "ann"}},
	{"ca adopted", events.CAAdoptedPayload{Certificates: 3, Fingerprint: "aa"},
		map[string]any{"fingerprint": "aa", "certificates": 3}},
	{"node adopted", events.NodeAdoptedPayload{Announced: true, Created: false, EK: "sha256:ab", MAC: "52:54:00:00:00:01", Node: "n1"},
		map[string]any{"node": "n1", "mac": "52:54:00:00:00:01", "ek": "sha256:ab", "created": false, "announced": true}},
	{"ek conflict", events.EKConflictPayload{BoundNode: "n1", EKHash: "sha256:ab", Node: "n2"},
		map[string]any{"ek_hash": "sha256:ab", "bound_node": "n1", "node": "n2"}},
	{"mac generated", events.MACGeneratedPayload{MAC: "52:54:00:00:00:01", Node: "n1"},
		map[string]any{"node": "n1", "mac": "52:54:00:00:00:01"}},
	{"bmc tls unverified", events.BMCTLSUnverifiedPayload{Node: "n1"}, map[string]any{"node": "n1"}},
	{"module pushed", events.ModulePushedPayload{Digest: "sha256:ab", Name: "m", Size: 1 << 40, Version: "1"},
		map[string]any{"name": "m", "version": "1", "digest": "sha256:ab", "size": int64(1 << 40)}},
	{"module pushed (empty)", events.ModulePushedPayload{Name: "m", Version: "1"},
		map[string]any{"name": "m", "version": "1", "digest": "", "size": int64(0)}},
	{"module deleted", events.ModuleDeletedPayload{Digest: "sha256:ab", Name: "m", Version: "1"},
		map[string]any{"name": "m", "version": "1", "digest": "sha256:ab"}},
	{"module signed", events.ModuleSignedPayload{Digest: "sha256:ab", Name: "m", Signer: "sha256:cd", Version: "1"},
		map[string]any{"name": "m", "version": "1", "digest": "sha256:ab", "signer": "sha256:cd"}},
	{"agent task finished", events.AgentTaskFinishedPayload{Error: "", ExitCode: intp(3), Status: store.TaskFailed},
		map[string]any{"status": store.TaskFailed, "exit_code": intp(3), "error": ""}},
	{"agent task finished (no exit code)", events.AgentTaskFinishedPayload{Error: "lost", Status: store.TaskFailed},
		map[string]any{"status": store.TaskFailed, "exit_code": (*int)(nil), "error": "lost"}},
	{"worker task finished", events.WorkerTaskFinishedPayload{Status: store.TaskSucceeded, Target: store.TaskTargetWorker},
		map[string]any{"status": store.TaskSucceeded, "error": "", "target": store.TaskTargetWorker}},
	{"provisioned in a pool", events.ProvisionedPayload{Node: "n1", OperationID: "op", PoolID: "p-1", Provider: "qemu"},
		map[string]any{"node": "n1", "provider": "qemu", "operation_id": "op", "pool_id": store.PoolID("p-1")}},
	{"provisioned alone", events.ProvisionedPayload{Node: "n1", Provider: "qemu"},
		map[string]any{"node": "n1", "provider": "qemu", "operation_id": ""}},
	{"token issued", events.TokenIssuedPayload{ExpiresAt: "2026-11-30T12:00:00Z", Superseded: 2},
		map[string]any{"expires_at": "2026-11-30T12:00:00Z", "superseded": 2}},
	{"token issued (none superseded)", events.TokenIssuedPayload{ExpiresAt: "2026-11-30T12:00:00Z"},
		map[string]any{"expires_at": "2026-11-30T12:00:00Z"}},
	{"transition", events.TransitionPayload{Event: "mark_errored", From: "booting", Reason: "r", To: "error"},
		map[string]any{"event": "mark_errored", "from": "booting", "to": "error", "reason": "r"}},
	{"agent error", events.AgentErrorPayload{Error: "disk", Phase: "fetch"}, map[string]any{"phase": "fetch", "error": "disk"}},
	{"held", events.HeldPayload{By: "ann", Reason: "debug"}, map[string]any{"by": "ann", "reason": "debug"}},
	{"unheld", events.UnheldPayload{By: "ann", Was: "debug"}, map[string]any{"by": "ann", "was": "debug"}},
	{"cordoned", events.CordonedPayload{By: "ann", CordonState: "fenced", PoolStateBefore: lifecycle.PoolReady, Reason: "r"},
		map[string]any{"by": "ann", "reason": "r", "cordon_state": "fenced", "pool_state_before": lifecycle.PoolReady}},
	{"cordoned (not pooled)", events.CordonedPayload{By: "ann", CordonState: "not_pooled"},
		map[string]any{"by": "ann", "reason": "", "cordon_state": "not_pooled", "pool_state_before": lifecycle.PoolState("")}},
	{"uncordoned", events.UncordonedPayload{By: "ann", UncordonState: "ready", Was: "r"},
		map[string]any{"by": "ann", "uncordon_state": "ready", "was": "r"}},
	{"machine created", events.MachineCreatedPayload{Machine: "vm-1", Provider: "qemu", State: "running"},
		map[string]any{"provider": "qemu", "machine": "vm-1", "state": "running"}},
	{"machine destroyed", events.MachineDestroyedPayload{Machine: "vm-1"}, map[string]any{"machine": "vm-1", "error": ""}},
	{"answer lost", events.AnswerLostPayload{Error: "timeout", Observed: "running", Op: "provision"},
		map[string]any{"op": store.TaskKind("provision"), "error": "timeout", "observed": "running"}},
	{"provider failed", events.ProviderFailedPayload{Error: "e", Kind: "transient", Observed: "", Op: "reboot", Provider: "qemu"},
		map[string]any{"op": "reboot", "provider": "qemu", "error": "e", "kind": "transient", "observed": ""}},
	{"provision failed", events.ProvisionFailedPayload{Error: "e", Kind: "permanent", Op: "provision", Provider: "qemu"},
		map[string]any{"op": store.TaskKind("provision"), "provider": "qemu", "error": "e", "kind": "permanent"}},
	{"provision abandoned", events.ProvisionAbandonedPayload{Op: "provision", Provider: "qemu"},
		map[string]any{"op": store.TaskKind("provision"), "provider": "qemu"}},
	{"machine exited", events.MachineExitedPayload{Detail: "d", Machine: "vm-1", Observed: "exited", Provider: "qemu", Source: "claim"},
		map[string]any{"provider": "qemu", "machine": "vm-1", "source": "claim", "observed": "exited", "detail": "d"}},
	{"guest present", events.GuestPresentPayload{Destroyed: true, Machine: "vm-1", Provider: "qemu", State: "running"},
		map[string]any{"provider": "qemu", "machine": "vm-1", "state": "running", "destroyed": true, "error": ""}},
	{"terminate requested", events.TerminateRequestedPayload{Machine: "vm-1", Status: lifecycle.Running},
		map[string]any{"status": lifecycle.Running, "machine": "vm-1"}},
	{"terminate failed", events.TerminateFailedPayload{Error: "e", Kind: "transient", Machine: "vm-1", Observed: "running", Provider: "qemu"},
		map[string]any{"provider": "qemu", "machine": "vm-1", "error": "e", "kind": "transient", "observed": "running"}},
	{"terminated", events.TerminatedPayload{Machine: "vm-1", Revoked: []store.CertSerial{"1f"}, TasksCancelled: 1, TokensExpired: 2},
		map[string]any{"machine": "vm-1", "revoked": []store.CertSerial{"1f"}, "tokens_expired": 2, "tasks_cancelled": 1}},
	{"terminated (nothing revoked)", events.TerminatedPayload{},
		map[string]any{"machine": "", "revoked": []store.CertSerial(nil), "tokens_expired": 0, "tasks_cancelled": 0}},
	{"silent", events.SilentPayload{LastHeartbeatAt: "t"}, map[string]any{"last_heartbeat_at": "t"}},
	{"presumed dead", events.PresumedDeadPayload{LastHeartbeatAt: "t", Observed: "gone"},
		map[string]any{"last_heartbeat_at": "t", "observed": "gone"}},
	{"boot timeout", events.BootTimeoutPayload{AgentPhase: "fetch", Status: lifecycle.Starting},
		map[string]any{"status": lifecycle.Starting, "agent_phase": "fetch", "agent_error": ""}},
	{"switch timeout", events.SwitchTimeoutPayload{AgentPhase: "switch", Status: lifecycle.Starting, SwitchTimeout: "5m0s"},
		map[string]any{"status": lifecycle.Starting, "agent_phase": "switch", "switch_timeout": "5m0s"}},
	{"script served", events.ScriptServedPayload{Remote: "10.0.2.15:1234", Status: "booting"},
		map[string]any{"remote": "10.0.2.15:1234", "status": "booting"}},
	{"script refused", events.ScriptRefusedPayload{Count: 1, Reason: "gone", Remote: "r", Status: 410},
		map[string]any{"remote": "r", "reason": "gone", "status": 410, "count": 1}},
	{"script refusals", events.ScriptRefusalsPayload{Coalesced: true, Count: 9, First: "a", Last: "b", Reason: "gone", Remote: "r", Status: 410},
		map[string]any{"remote": "r", "reason": "gone", "status": 410, "count": 9, "coalesced": true, "first": "a", "last": "b"}},
	{"uki served", events.UKIServedPayload{Digest: "sha256:ab", MAC: "m", Remote: "r", Signed: false, Template: "t"},
		map[string]any{"mac": "m", "remote": "r", "template": "t", "digest": "sha256:ab", "signed": false}},
	{"machine refused (no mac)", events.MachineRefusedPayload{Reason: events.RefusedMalformed, Remote: "r"},
		map[string]any{"mac": "", "reason": events.RefusedMalformed, "remote": "r"}},
	{"refusals of one source", events.SourceRefusalsPayload{Coalesced: true, Count: 3, First: "a", Last: "b", Remote: "10.0.2.15"},
		map[string]any{"count": 3, "coalesced": true, "first": "a", "last": "b", "remote": "10.0.2.15"}},
	{"refusals of one source (unnamed)", events.SourceRefusalsPayload{Coalesced: true, Count: 3, First: "a", Last: "b"},
		map[string]any{"count": 3, "coalesced": true, "first": "a", "last": "b", "remote": ""}},
	{"refusals of all sources", events.AllSourcesRefusalsPayload{AllSources: true, Coalesced: true, Count: 3, First: "a", Last: "b"},
		map[string]any{"count": 3, "coalesced": true, "first": "a", "last": "b", "all_sources": true}},
	{"announced with an issuer", events.AnnouncedPayload{EK: "sha256:ab", EKCertificate: true, EKCertificateIssuer: "CN=x", MAC: "m", Remote: "r"},
		map[string]any{"mac": "m", "ek": "sha256:ab", "ek_certificate": true, "remote": "r", "ek_certificate_issuer": "CN=x"}},
	{"announced", events.AnnouncedPayload{EK: "sha256:ab", MAC: "m", Remote: "r"},
		map[string]any{"mac": "m", "ek": "sha256:ab", "ek_certificate": false, "remote": "r"}},
	{"claimed", claim, attribution("2026-11-30T12:00:00Z")},
	{"claimed (no acquisition time)", unacquired, attribution("")},
	{"released", claim.Released("recycled", "", 90, "t"),
		with(attribution("2026-11-30T12:00:00Z"), "disposition", "recycled", "released_at", "t", "held_seconds", int64(90))},
	{"released errored", unacquired.Released("errored", "terminate failed", 0, "t"),
		with(attribution(""), "disposition", "errored", "released_at", "t", "held_seconds", int64(0), "error", "terminate failed")},
	{"claim stale", claim.Stale(7200, 3600),
		with(attribution("2026-11-30T12:00:00Z"), "held_seconds", int64(7200), "claimed_ttl_seconds", int64(3600))},
	{"claim silent", unacquired.Silent("t"), with(attribution(""), "last_heartbeat_at", "t")},
	{"member ready", events.MemberReadyPayload{PoolState: lifecycle.PoolReady, WarmSeconds: 31},
		map[string]any{"pool_state": lifecycle.PoolReady, "warm_seconds": int64(31)}},
	{"ready stale heartbeat", events.ReadyStaleHeartbeatPayload{LastHeartbeatAt: "t", StaleAfterSeconds: 90},
		map[string]any{"last_heartbeat_at": "t", "stale_after_seconds": int64(90)}},
	{"drain failed", events.DrainFailedPayload{Drained: 1, During: "drain", Errors: map[string]string{"i-2": "b", "i-1": "a"},
		FailedInstanceIDs: []store.InstanceID{"i-1", "i-2"}, TerminateFailed: 2},
		map[string]any{"during": "drain", "failed_instance_ids": []store.InstanceID{"i-1", "i-2"}, "errors": map[string]any{"i-2": "b", "i-1": "a"},
			"drained": 1, "terminate_failed": 2}},
	{"terminate failures", events.TerminateFailuresPayload{During: "claim", Error: "e", FailedInstanceIDs: []store.InstanceID{"i-1"}},
		map[string]any{"failed_instance_ids": []store.InstanceID{"i-1"}, "during": "claim", "error": "e"}},
	{"terminate abandoned", events.TerminateAbandonedPayload{Attempts: 5, Machine: "vm-1", Error: "e"},
		map[string]any{"attempts": 5, "machine": "vm-1", "error": "e"}},
}

// TestPayloadsEncodeAsTheirMaps: each typed payload stores the bytes its
// map form did, zero values and omitted keys included.
func TestPayloadsEncodeAsTheirMaps(t *testing.T) {
	for _, tc := range payloadCases {
		t.Run(tc.name, func(t *testing.T) {
			want, err := json.Marshal(tc.old)
			if err != nil {
				t.Fatal(err)
			}
			if got := stored(t, tc.typed); got != string(want) {
				t.Errorf("stored %s\n  want %s", got, want)
			}
		})
	}
}

// TestRestoredPayloadKeepsItsText: controlplane.restored was written by
// hand, in its own key order; the typed payload keeps that text.
func TestRestoredPayloadKeepsItsText(t *testing.T) {
	for _, tc := range []struct {
		created, restored string
		keysOnly          bool
		missing           int
	}{
		{"2026-11-30T12:00:00.123456789Z", "2026-11-30T13:00:00Z", false, 0},
		{"2026-11-30T12:00:00+01:00", "2026-11-30T13:00:00Z", true, 3},
	} {
		want := fmt.Sprintf(`{"backup_created_at":%q,"restored_at":%q,"keys_only":%t,"missing_blobs":%d}`,
			tc.created, tc.restored, tc.keysOnly, tc.missing)
		got := stored(t, events.RestoredPayload{BackupCreatedAt: tc.created, RestoredAt: tc.restored, KeysOnly: tc.keysOnly, MissingBlobs: tc.missing})
		if got != want {
			t.Errorf("stored %s\n  want %s", got, want)
		}
	}
}

// TestPayloadFieldsAreSorted: a field out of sorted JSON-name order would
// store its keys in another order than a map did (RestoredPayload keeps
// its hand-written order on purpose).
func TestPayloadFieldsAreSorted(t *testing.T) {
	seen := map[reflect.Type]bool{}
	for _, tc := range payloadCases {
		typ := reflect.TypeOf(tc.typed)
		if seen[typ] {
			continue
		}
		seen[typ] = true
		var names []string
		for i := 0; i < typ.NumField(); i++ {
			tag := typ.Field(i).Tag.Get("json")
			if tag == "" {
				t.Errorf("%s.%s has no json name", typ.Name(), typ.Field(i).Name)
			}
			names = append(names, strings.Split(tag, ",")[0])
		}
		if !slices.IsSorted(names) {
			t.Errorf("%s fields %v are not in sorted order", typ.Name(), names)
		}
	}
}

// TestEveryPayloadHasACase: a payload type added to payload.go without a
// case here would escape the tests above.
func TestEveryPayloadHasACase(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "payload.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{"RestoredPayload": true} // TestRestoredPayloadKeepsItsText
	for _, tc := range payloadCases {
		covered[reflect.TypeOf(tc.typed).Name()] = true
	}
	n := 0
	ast.Inspect(f, func(node ast.Node) bool {
		if ts, ok := node.(*ast.TypeSpec); ok {
			if _, isStruct := ts.Type.(*ast.StructType); isStruct {
				n++
				if !covered[ts.Name.Name] {
					t.Errorf("payload %s has no case in payloadCases", ts.Name.Name)
				}
			}
		}
		return true
	})
	if n < 50 {
		t.Fatalf("found %d payload structs in payload.go; the parse missed them", n)
	}
}

// TestNoPayloadStoresAnEmptyObject: an event without a payload stores
// "{}", as a nil or empty map did.
func TestNoPayloadStoresAnEmptyObject(t *testing.T) {
	var none *events.RenewedPayload
	for _, tc := range []struct {
		name string
		p    events.Payload
	}{{"nil", nil}, {"nil pointer", none}} {
		if got := stored(t, tc.p); got != "{}" {
			t.Errorf("%s payload stored %s; want {}", tc.name, got)
		}
	}
}

// stored is what Write hands the store for an event with payload p.
func stored(t *testing.T, p events.Payload) string {
	t.Helper()
	a := &appender{}
	if _, err := (events.E{Kind: events.InstanceSilent, Payload: p}).Write(context.Background(), a, time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	return string(a.got[0].Payload)
}
