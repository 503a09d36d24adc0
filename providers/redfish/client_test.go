package redfish

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// fixtureBMC serves a vendor's mockup (testdata/<vendor>.json: @odata.id
// to body), and records writes.
type fixtureBMC struct {
	docs map[string]json.RawMessage
	srv  *httptest.Server

	mu     sync.Mutex
	writes []string // "PATCH path If-Match body"
	// refuse answers every write with this status and testdata body.
	refuse     int
	refuseBody []byte
}

func newFixtureBMC(t *testing.T, vendor string) *fixtureBMC {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", vendor+".json"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixtureBMC{}
	if err := json.Unmarshal(b, &f.docs); err != nil {
		t.Fatalf("%s: %v", vendor, err)
	}
	f.srv = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixtureBMC) serve(w http.ResponseWriter, r *http.Request) {
	if u, p, ok := r.BasicAuth(); !ok || u != "root" || p != "calvin" {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodGet {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		line := r.Method + " " + r.URL.Path
		if im := r.Header.Get("If-Match"); im != "" {
			line += " " + im
		}
		f.writes = append(f.writes, line+" "+string(body))
		refuse, rb := f.refuse, f.refuseBody
		f.mu.Unlock()
		if refuse != 0 {
			w.WriteHeader(refuse)
			w.Write(rb)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	doc, ok := f.docs[r.URL.Path]
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(doc)
}

func (f *fixtureBMC) client(t *testing.T) *Client {
	u, _ := url.Parse(f.srv.URL)
	return NewClient(u, f.srv.Client(), "root", "calvin")
}

func TestClientVendorShapes(t *testing.T) {
	for _, tc := range []struct {
		vendor, path string
		wantID       string
		wantPower    PowerState
		wantTypes    []ResetType // nil: the service states none
		wantPatch    string      // where a Boot PATCH goes, and its If-Match
		wantReset    string
	}{
		{vendor: "idrac", path: "/redfish/v1/Systems/System.Embedded.1", wantID: "System.Embedded.1", wantPower: PowerOn,
			wantTypes: []ResetType{"On", "ForceOff", "ForceRestart", "GracefulRestart", "GracefulShutdown", "PushPowerButton", "Nmi", "PowerCycle"},
			wantPatch: `PATCH /redfish/v1/Systems/System.Embedded.1 W/"gen-41"`, wantReset: "POST /redfish/v1/Systems/System.Embedded.1/Actions/ComputerSystem.Reset"},
		// iLO ends its links with slashes; the node's address need not.
		{vendor: "ilo", path: "/redfish/v1/Systems/1", wantID: "1", wantPower: PowerOff,
			wantTypes: []ResetType{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "Nmi", "PushPowerButton", "GracefulRestart"},
			wantPatch: `PATCH /redfish/v1/Systems/1/ W/"8DD1A2F0"`, wantReset: "POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset/"},
		// OpenBMC lists reset types in an ActionInfo and sends no ETag.
		{vendor: "openbmc", path: "", wantID: "system", wantPower: PowerOn,
			wantTypes: []ResetType{"On", "ForceOff", "ForceOn", "ForceRestart", "GracefulRestart", "GracefulShutdown", "PowerCycle", "Nmi"},
			wantPatch: `PATCH /redfish/v1/Systems/system`, wantReset: "POST /redfish/v1/Systems/system/Actions/ComputerSystem.Reset"},
		// The DMTF rackmount mockup applies writes through @Redfish.Settings.
		{vendor: "dmtf-rackmount", path: "/redfish/v1/Systems/437XR1138R2", wantID: "437XR1138R2", wantPower: PowerOn,
			wantTypes: []ResetType{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn", "PushPowerButton"},
			wantPatch: `PATCH /redfish/v1/Systems/437XR1138R2/SD`, wantReset: "POST /redfish/v1/Systems/437XR1138R2/Actions/ComputerSystem.Reset"},
		{vendor: "dmtf-rackmount", path: "/redfish/v1/Systems/529QB9450R6", wantID: "529QB9450R6", wantPower: PowerOff,
			wantTypes: nil, wantPatch: `PATCH /redfish/v1/Systems/529QB9450R6`, wantReset: "POST /redfish/v1/Systems/529QB9450R6/Actions/ComputerSystem.Reset"},
	} {
		t.Run(tc.vendor+tc.path, func(t *testing.T) {
			f := newFixtureBMC(t, tc.vendor)
			c := f.client(t)
			ctx := context.Background()
			sys, err := c.FindSystem(ctx, tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if sys.ID != tc.wantID || sys.PowerState != tc.wantPower {
				t.Errorf("system %s %s, want %s %s", sys.ID, sys.PowerState, tc.wantID, tc.wantPower)
			}
			types, err := c.ResetTypes(ctx, sys)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(types, tc.wantTypes) {
				t.Errorf("reset types %v, want %v", types, tc.wantTypes)
			}
			if err := c.PatchBoot(ctx, sys, BootPatch{BootSourceOverrideEnabled: OverrideOnce, BootSourceOverrideTarget: TargetPxe}); err != nil {
				t.Fatal(err)
			}
			if err := c.Reset(ctx, sys, ResetOn); err != nil {
				t.Fatal(err)
			}
			want := []string{tc.wantPatch + ` {"Boot":{"BootSourceOverrideEnabled":"Once","BootSourceOverrideTarget":"Pxe"}}`, tc.wantReset + ` {"ResetType":"On"}`}
			if !slices.Equal(f.writes, want) {
				t.Errorf("writes\n%q\nwant\n%q", f.writes, want)
			}
		})
	}
}

func TestClientFindSystemRefusals(t *testing.T) {
	f := newFixtureBMC(t, "dmtf-rackmount")
	c := f.client(t)
	for _, tc := range []struct{ path, want string }{
		{"", "has 2 systems"},
		{"/redfish/v1/Systems/nope", "no system /redfish/v1/Systems/nope in the BMC's Systems collection"},
	} {
		_, err := c.FindSystem(context.Background(), tc.path)
		var he *HTTPError
		if !errors.As(err, &he) || he.Status != http.StatusNotFound || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("FindSystem(%q) = %v, want a 404 saying %q", tc.path, err, tc.want)
		}
	}
}

func TestClientErrorBody(t *testing.T) {
	f := newFixtureBMC(t, "idrac")
	body, err := os.ReadFile(filepath.Join("testdata", "error-refused.json"))
	if err != nil {
		t.Fatal(err)
	}
	f.refuse, f.refuseBody = http.StatusBadRequest, body
	c := f.client(t)
	sys, err := c.FindSystem(context.Background(), "/redfish/v1/Systems/System.Embedded.1")
	if err != nil {
		t.Fatal(err)
	}
	err = c.Reset(context.Background(), sys, ResetForceOff)
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != 400 {
		t.Fatalf("got %v, want a 400", err)
	}
	want := []string{"Unable to complete the operation because the server is in a maintenance lock.", "The action ForceOff is not supported by the resource."}
	if !slices.Equal(he.Messages, want) {
		t.Errorf("messages %q, want %q", he.Messages, want)
	}
	if !strings.Contains(err.Error(), "maintenance lock") {
		t.Errorf("error text %q lacks the BMC's message", err)
	}
}

func TestClientWrongCredentials(t *testing.T) {
	f := newFixtureBMC(t, "idrac")
	u, _ := url.Parse(f.srv.URL)
	c := NewClient(u, f.srv.Client(), "root", "wrong-secret-xyz")
	_, err := c.Systems(context.Background())
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
		t.Fatalf("got %v, want 401", err)
	}
	if strings.Contains(err.Error(), "wrong-secret-xyz") {
		t.Errorf("the error names the password: %v", err)
	}
}

func TestClientRefusesForeignLinks(t *testing.T) {
	c := NewClient(&url.URL{Scheme: "https", Host: "bmc.example:443"}, http.DefaultClient, "u", "p")
	for _, ref := range []string{"https://elsewhere.example/redfish/v1/Systems/1", "relative/path"} {
		if _, err := c.resolve(ref); err == nil {
			t.Errorf("resolve(%q) succeeded; a link off the BMC or a relative one must be refused", ref)
		}
	}
}

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in, base, path, err string
	}{
		{in: "redfish://10.0.0.5/redfish/v1/Systems/1", base: "https://10.0.0.5", path: "/redfish/v1/Systems/1"},
		{in: "redfish://bmc-7.rack:8443/redfish/v1/Systems/System.Embedded.1/", base: "https://bmc-7.rack:8443", path: "/redfish/v1/Systems/System.Embedded.1"},
		{in: "redfish://[::1]:9443", base: "https://[::1]:9443", path: ""},
		{in: "redfish://h/redfish/v1/", base: "https://h", path: ""},
		{in: "https://h/redfish/v1/Systems/1", err: "scheme must be redfish://"},
		{in: "redfish://admin:hunter2@h/redfish/v1/Systems/1", err: "holds user information"},
		{in: "redfish:///redfish/v1/Systems/1", err: "no host"},
		{in: "redfish://h/other/1", err: "is not a Redfish resource"},
		{in: "redfish://h:99999/redfish/v1/Systems/1", err: "port"},
		{in: "redfish://h/redfish/v1/Systems/1?x=1", err: "query"},
	} {
		ep, err := ParseEndpoint(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseEndpoint(%q) = %v, want error %q", tc.in, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the error repeats the password: %v", err)
			}
			continue
		}
		if err != nil || ep.Base.String() != tc.base || ep.SystemPath != tc.path {
			t.Errorf("ParseEndpoint(%q) = %v %q, %v; want %s %q", tc.in, ep.Base, ep.SystemPath, err, tc.base, tc.path)
		}
	}
}

func TestParseFingerprint(t *testing.T) {
	hex64 := strings.Repeat("ab", 32)
	for _, tc := range []struct{ in, want string }{
		{"sha256:" + hex64, "sha256:" + hex64},
		{"SHA256:" + strings.ToUpper(hex64), "sha256:" + hex64},
		{"sha256:" + strings.Repeat("AB:", 31) + "AB", "sha256:" + hex64},
		{"sha1:" + hex64, ""},
		{"sha256:abcd", ""},
		{"sha256:" + strings.Repeat("zz", 32), ""},
	} {
		got, err := ParseFingerprint(tc.in)
		if (err == nil) != (tc.want != "") || got != tc.want {
			t.Errorf("ParseFingerprint(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
