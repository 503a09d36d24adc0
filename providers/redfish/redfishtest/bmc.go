// Package redfishtest is a test BMC: a small Redfish service over TLS
// (from a throwaway test CA) with basic auth, whose systems drive a
// Machine (an in-memory one, or a real QEMU VM through the qemu
// provider, as sushy-tools drives libvirt). It can be told to fail: refuse
// an action with a Redfish error body, hang without answering, act and
// then drop the connection before answering, or report a stale
// PowerState. It is for tests only and is not part of tetherd.
package redfishtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/providers/redfish"
)

// Machine is what a system's power actions drive.
type Machine interface {
	PowerOn(ctx context.Context) error
	// PowerOff stops the machine; graceful asks its OS, which may ignore it.
	PowerOff(ctx context.Context, graceful bool) error
	// Restart restarts a running machine.
	Restart(ctx context.Context, graceful bool) error
	PowerState(ctx context.Context) (redfish.PowerState, error)
}

// FaultKind is how a request fails.
type FaultKind int

const (
	// Refuse answers with Status and a Redfish error body naming Message.
	Refuse FaultKind = iota
	// Hang never answers (until the client gives up) and does not act.
	Hang
	// DropAfterAct acts, then closes the connection without an answer.
	DropAfterAct
	// Stale (with Op "stale") makes the Count reads of the system after
	// its next reset report the PowerState from before that reset.
	Stale
)

// Fault is a failure to inject. Op matches requests: "reset" (any
// ComputerSystem.Reset), "reset:ForceOff" (one reset type), "patch",
// "get" (a read of the system), "systems" (the collection), "stale" (for
// Kind Stale). Count is how
// many matching requests fail (0 means 1).
type Fault struct {
	Op      string
	Kind    FaultKind
	Status  int
	Message string
	Count   int
}

// Options shape the service like one vendor's or another's.
type Options struct {
	Username, Password string
	// SystemsPath is the Systems collection's @odata.id (default
	// /redfish/v1/Systems).
	SystemsPath string
	// ResetTypes are the reset types offered (default: the schema's
	// common set). ActionInfo lists them in a ResetActionInfo resource
	// instead of inline.
	ResetTypes []redfish.ResetType
	ActionInfo bool
	// RequireIfMatch refuses a PATCH without the current ETag (428, 412).
	RequireIfMatch bool
	// Settings applies Boot writes through a @Redfish.Settings object;
	// a PATCH of the system itself is refused.
	Settings bool
}

// DefaultResetTypes are offered when Options.ResetTypes is nil.
var DefaultResetTypes = []redfish.ResetType{redfish.ResetOn, redfish.ResetForceOff, redfish.ResetGracefulShutdown,
	redfish.ResetGracefulRestart, redfish.ResetForceRestart, redfish.ResetPushPowerButton}

type system struct {
	id      string
	m       Machine
	boot    redfish.Boot
	version int
	// stale reads left, and the state they report.
	stale      int
	staleState redfish.PowerState
	// boots records the override each power-on or restart booted with.
	boots []string
}

// BMC is the test service.
type BMC struct {
	opts Options
	srv  *httptest.Server
	ca   []byte
	fp   string

	mu      sync.Mutex
	systems map[string]*system
	order   []string
	faults  []Fault
	calls   []string
	auths   []string // every Authorization user seen
}

// New starts a BMC on loopback; it stops when the test ends.
func New(tb testing.TB, opts Options) *BMC {
	tb.Helper()
	if opts.SystemsPath == "" {
		opts.SystemsPath = "/redfish/v1/Systems"
	}
	opts.SystemsPath = strings.TrimRight(opts.SystemsPath, "/")
	if opts.ResetTypes == nil {
		opts.ResetTypes = DefaultResetTypes
	}
	b := &BMC{opts: opts, systems: map[string]*system{}}
	caPEM, cert, err := testCertificates()
	if err != nil {
		tb.Fatalf("test BMC certificates: %v", err)
	}
	b.ca = caPEM
	b.fp = redfish.Fingerprint(cert.Certificate[0])
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(b.serve))
	b.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	// Clients that give up mid-handshake are the faults under test, not news.
	b.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	b.srv.StartTLS()
	tb.Cleanup(b.srv.Close)
	return b
}

// Host is HOST:PORT.
func (b *BMC) Host() string { return strings.TrimPrefix(b.srv.URL, "https://") }

// CAPEM is the test CA that signed the BMC's certificate.
func (b *BMC) CAPEM() []byte { return b.ca }

// Fingerprint is the sha256 pin of the BMC's certificate.
func (b *BMC) Fingerprint() string { return b.fp }

// SystemPath is a system's @odata.id.
func (b *BMC) SystemPath(id string) string { return b.opts.SystemsPath + "/" + id }

// Address is a node's --bmc value for system id.
func (b *BMC) Address(id string) string { return "redfish://" + b.Host() + b.SystemPath(id) }

// AddSystem adds a system driven by m, with no boot override set.
func (b *BMC) AddSystem(id string, m Machine) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.systems[id] = &system{id: id, m: m, version: 1, boot: redfish.Boot{BootSourceOverrideEnabled: redfish.OverrideDisabled,
		BootSourceOverrideTarget: "None", BootSourceOverrideMode: redfish.ModeUEFI,
		AllowableTargets: []string{"None", redfish.TargetPxe, "Hdd", "Cd", "BiosSetup"}}}
	b.order = append(b.order, id)
}

// SetAllowableTargets sets the boot override targets system id offers.
func (b *BMC) SetAllowableTargets(id string, targets []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.systems[id].boot.AllowableTargets = targets
}

// Inject queues a fault.
func (b *BMC) Inject(f Fault) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f.Count <= 0 {
		f.Count = 1
	}
	b.faults = append(b.faults, f)
}

// Boot is system id's Boot property now.
func (b *BMC) Boot(id string) redfish.Boot {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.systems[id].boot
}

// Boots lists, per power-on or restart of system id, the override target
// it booted with ("Pxe", or "None" for its normal boot order).
func (b *BMC) Boots(id string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.systems[id].boots)
}

// Calls lists the requests that changed something ("reset ForceOff 1",
// "patch 1"), in order.
func (b *BMC) Calls() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls)
}

// Users lists the user name of every authenticated request, to check
// what credentials reached the BMC.
func (b *BMC) Users() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.auths)
}

// take removes and returns the first queued fault matching op.
func (b *BMC) take(ops ...string) (Fault, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, f := range b.faults {
		if slices.Contains(ops, f.Op) {
			f.Count--
			if f.Count <= 0 {
				b.faults = slices.Delete(b.faults, i, i+1)
			} else {
				b.faults[i] = f
			}
			return f, true
		}
	}
	return Fault{}, false
}

func (b *BMC) serve(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimRight(r.URL.Path, "/")
	if path == "/redfish/v1" && r.Method == http.MethodGet {
		// The service root answers without authentication, as the
		// specification requires.
		writeJSON(w, http.StatusOK, map[string]any{"@odata.id": "/redfish/v1/", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
			"Id": "RootService", "RedfishVersion": "1.6.0", "Systems": map[string]string{"@odata.id": b.opts.SystemsPath}})
		return
	}
	if !b.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Basic realm="BMC"`)
		writeError(w, http.StatusUnauthorized, "Base.1.8.InsufficientPrivilege", "The authentication credentials included with this request are missing or invalid.")
		return
	}
	if path == b.opts.SystemsPath && r.Method == http.MethodGet {
		if b.fault(w, r, nil, "systems") {
			return
		}
		b.mu.Lock()
		members := make([]map[string]string, 0, len(b.order))
		for _, id := range b.order {
			members = append(members, map[string]string{"@odata.id": b.SystemPath(id)})
		}
		b.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"@odata.id": b.opts.SystemsPath, "Name": "Computer System Collection",
			"Members": members, "Members@odata.count": len(members)})
		return
	}
	rest, ok := strings.CutPrefix(path, b.opts.SystemsPath+"/")
	if !ok {
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", fmt.Sprintf("The resource at the URI %s was not found.", r.URL.Path))
		return
	}
	id, sub, _ := strings.Cut(rest, "/")
	b.mu.Lock()
	sys := b.systems[id]
	b.mu.Unlock()
	if sys == nil {
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", fmt.Sprintf("The resource at the URI %s was not found.", r.URL.Path))
		return
	}
	switch {
	case sub == "" && r.Method == http.MethodGet:
		b.getSystem(w, r, sys)
	case (sub == "" && !b.opts.Settings || sub == "Settings" && b.opts.Settings) && r.Method == http.MethodPatch:
		b.patch(w, r, sys)
	case sub == "" && r.Method == http.MethodPatch:
		writeError(w, http.StatusMethodNotAllowed, "Base.1.8.OperationNotAllowed", "Boot settings are applied through the settings object.")
	case sub == "Actions/ComputerSystem.Reset" && r.Method == http.MethodPost:
		b.reset(w, r, sys)
	case sub == "ResetActionInfo" && r.Method == http.MethodGet && b.opts.ActionInfo:
		writeJSON(w, http.StatusOK, map[string]any{"@odata.id": b.SystemPath(id) + "/ResetActionInfo", "@odata.type": "#ActionInfo.v1_1_2.ActionInfo",
			"Parameters": []map[string]any{{"Name": "ResetType", "Required": true, "DataType": "String", "AllowableValues": b.opts.ResetTypes}}})
	default:
		writeError(w, http.StatusMethodNotAllowed, "Base.1.8.OperationNotAllowed", fmt.Sprintf("%s is not allowed on %s.", r.Method, r.URL.Path))
	}
}

func (b *BMC) authorized(r *http.Request) bool {
	u, p, ok := r.BasicAuth()
	if !ok {
		return false
	}
	b.mu.Lock()
	b.auths = append(b.auths, u)
	b.mu.Unlock()
	return subtle.ConstantTimeCompare([]byte(u), []byte(b.opts.Username)) == 1 &&
		subtle.ConstantTimeCompare([]byte(p), []byte(b.opts.Password)) == 1
}

// fault applies a queued fault for ops, if any; act is the request's
// effect, for DropAfterAct. It reports whether the request was handled.
func (b *BMC) fault(w http.ResponseWriter, r *http.Request, act func() error, ops ...string) bool {
	f, ok := b.take(ops...)
	if !ok {
		return false
	}
	switch f.Kind {
	case Refuse:
		st := f.Status
		if st == 0 {
			st = http.StatusBadRequest
		}
		writeError(w, st, "Base.1.8.ActionNotSupported", f.Message)
	case Hang:
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Minute):
		}
	case DropAfterAct:
		if act != nil {
			_ = act()
		}
		drop(w)
	case Stale:
		return false
	}
	return true
}

// drop closes the connection without an answer.
func drop(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func (b *BMC) getSystem(w http.ResponseWriter, r *http.Request, sys *system) {
	if b.fault(w, r, nil, "get") {
		return
	}
	ps, err := sys.m.PowerState(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", "power state: "+err.Error())
		return
	}
	b.mu.Lock()
	if sys.stale > 0 {
		sys.stale--
		ps = sys.staleState
	}
	path := b.SystemPath(sys.id)
	reset := map[string]any{"target": path + "/Actions/ComputerSystem.Reset"}
	if b.opts.ActionInfo {
		reset["@Redfish.ActionInfo"] = path + "/ResetActionInfo"
	} else {
		reset["ResetType@Redfish.AllowableValues"] = b.opts.ResetTypes
	}
	doc := map[string]any{"@odata.id": path, "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem", "Id": sys.id,
		"Name": "Test system " + sys.id, "SystemType": "Physical", "PowerState": ps, "Boot": sys.boot,
		"Actions": map[string]any{"#ComputerSystem.Reset": reset}}
	if b.opts.Settings {
		doc["@Redfish.Settings"] = map[string]any{"@odata.type": "#Settings.v1_3_0.Settings",
			"SettingsObject": map[string]string{"@odata.id": path + "/Settings"}}
	}
	etag := sys.etag()
	b.mu.Unlock()
	w.Header().Set("ETag", etag)
	writeJSON(w, http.StatusOK, doc)
}

func (s *system) etag() string { return fmt.Sprintf(`W/"%d"`, s.version) }

func (b *BMC) patch(w http.ResponseWriter, r *http.Request, sys *system) {
	var body struct {
		Boot *redfish.BootPatch `json:"Boot"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil || body.Boot == nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.MalformedJSON", "The request body is not a Boot patch.")
		return
	}
	b.mu.Lock()
	etag := sys.etag()
	b.mu.Unlock()
	if b.opts.RequireIfMatch {
		switch im := r.Header.Get("If-Match"); {
		case im == "":
			writeError(w, http.StatusPreconditionRequired, "Base.1.8.PreconditionRequired", "An If-Match header is required.")
			return
		case im != etag:
			writeError(w, http.StatusPreconditionFailed, "Base.1.8.PreconditionFailed", "The ETag does not match the resource.")
			return
		}
	}
	apply := func() error {
		p := body.Boot
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, v := range []struct{ field, val string }{{"BootSourceOverrideEnabled", p.BootSourceOverrideEnabled},
			{"BootSourceOverrideMode", p.BootSourceOverrideMode}} {
			if v.val != "" && !slices.Contains(allowed[v.field], v.val) {
				return fmt.Errorf("The value %s for the property %s is not in the list of acceptable values.", v.val, v.field)
			}
		}
		if p.BootSourceOverrideTarget != "" && !slices.Contains(sys.boot.AllowableTargets, p.BootSourceOverrideTarget) {
			return fmt.Errorf("The value %s for the property BootSourceOverrideTarget is not in the list of acceptable values.", p.BootSourceOverrideTarget)
		}
		if p.BootSourceOverrideEnabled != "" {
			sys.boot.BootSourceOverrideEnabled = p.BootSourceOverrideEnabled
		}
		if p.BootSourceOverrideTarget != "" {
			sys.boot.BootSourceOverrideTarget = p.BootSourceOverrideTarget
		}
		if p.BootSourceOverrideMode != "" {
			sys.boot.BootSourceOverrideMode = p.BootSourceOverrideMode
		}
		sys.version++
		b.calls = append(b.calls, fmt.Sprintf("patch %s %s/%s/%s", sys.id, sys.boot.BootSourceOverrideEnabled, sys.boot.BootSourceOverrideTarget, sys.boot.BootSourceOverrideMode))
		return nil
	}
	if b.fault(w, r, apply, "patch") {
		return
	}
	if err := apply(); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

var allowed = map[string][]string{
	"BootSourceOverrideEnabled": {redfish.OverrideDisabled, redfish.OverrideOnce, redfish.OverrideContinuous},
	"BootSourceOverrideMode":    {redfish.ModeUEFI, redfish.ModeLegacy},
}

func (b *BMC) reset(w http.ResponseWriter, r *http.Request, sys *system) {
	var body struct {
		ResetType redfish.ResetType `json:"ResetType"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil || body.ResetType == "" {
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterMissing", "The action ComputerSystem.Reset requires the parameter ResetType to be present in the request body.")
		return
	}
	rt := body.ResetType
	if !slices.Contains(b.opts.ResetTypes, rt) {
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterValueNotInList",
			fmt.Sprintf("The value %s for the parameter ResetType in the action ComputerSystem.Reset is not in the list of acceptable values.", rt))
		return
	}
	ctx := context.WithoutCancel(r.Context())
	act := func() error { return b.act(ctx, sys, rt) }
	if b.fault(w, r, act, "reset", "reset:"+string(rt)) {
		return
	}
	if f, ok := b.take("stale"); ok {
		before, _ := sys.m.PowerState(ctx)
		b.mu.Lock()
		sys.stale, sys.staleState = f.Count, before
		b.mu.Unlock()
	}
	if err := act(); err != nil {
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// act performs a reset on the machine and records the boot it causes.
func (b *BMC) act(ctx context.Context, sys *system, rt redfish.ResetType) error {
	b.mu.Lock()
	b.calls = append(b.calls, fmt.Sprintf("reset %s %s", rt, sys.id))
	b.mu.Unlock()
	ps, err := sys.m.PowerState(ctx)
	if err != nil {
		return err
	}
	on := ps == redfish.PowerOn || ps == redfish.PowerPoweringOn
	switch rt {
	case redfish.ResetOn, redfish.ResetForceOn:
		if on {
			return nil
		}
		b.booting(sys)
		return sys.m.PowerOn(ctx)
	case redfish.ResetForceOff:
		return sys.m.PowerOff(ctx, false)
	case redfish.ResetGracefulShutdown:
		return sys.m.PowerOff(ctx, true)
	case redfish.ResetPushPowerButton:
		if on {
			return sys.m.PowerOff(ctx, true)
		}
		b.booting(sys)
		return sys.m.PowerOn(ctx)
	case redfish.ResetGracefulRestart, redfish.ResetForceRestart:
		if !on {
			return nil
		}
		b.booting(sys)
		return sys.m.Restart(ctx, rt == redfish.ResetGracefulRestart)
	}
	return fmt.Errorf("reset type %s is not implemented by the test BMC", rt)
}

// booting records what a boot boots from and spends a one-time override,
// as firmware does when it honours it.
func (b *BMC) booting(sys *system) {
	b.mu.Lock()
	defer b.mu.Unlock()
	target := "None"
	if sys.boot.BootSourceOverrideEnabled != redfish.OverrideDisabled {
		target = sys.boot.BootSourceOverrideTarget
	}
	sys.boots = append(sys.boots, target)
	if sys.boot.BootSourceOverrideEnabled == redfish.OverrideOnce {
		sys.boot.BootSourceOverrideEnabled = redfish.OverrideDisabled
		sys.version++
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers with a Redfish error body, the BMC's words in
// @Message.ExtendedInfo.
func writeError(w http.ResponseWriter, status int, id, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": "Base.1.8.GeneralError",
		"message":               "A general error has occurred. See ExtendedInfo for more information.",
		"@Message.ExtendedInfo": []map[string]any{{"@odata.type": "#Message.v1_1_1.Message", "MessageId": id, "Message": msg, "Severity": "Warning"}}}})
}

// testCertificates makes a CA and a server certificate for 127.0.0.1,
// ::1 and localhost signed by it.
func testCertificates() ([]byte, tls.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	now := time.Now()
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Tether test BMC CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "test-bmc"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
