package netboot_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/controlplane/netboot"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// tokenShape is a whole bootstrap token (pki.NewToken: the prefix and 32
// bytes in unpadded base64url).
var tokenShape = regexp.MustCompile(`tbt_[A-Za-z0-9_-]{43}`)

// servesToken reports whether body holds a token the request did not
// bring itself: a redirect that echoes the caller's own query back (GET
// "0?tbt_" is sent on to "/0?tbt_") hands out nothing, which the first
// version of this check, any "tbt_" in the body, took for a leak.
func servesToken(body, path, query string) bool {
	for _, m := range tokenShape.FindAllString(body, -1) {
		if !strings.Contains(path, m) && !strings.Contains(query, m) {
			return true
		}
	}
	return false
}

// FuzzBootRoute sends fuzzed paths and queries to the netboot handler, with
// one instance waiting in its boot window. Whatever arrives: no panic, no
// 500, and a token leaves only in a 200 answer to that instance's own
// script path, once per boot (a token is never handed out twice).
func FuzzBootRoute(f *testing.F) {
	fx := setup(f)
	in := fx.provision(f)
	h := fx.srv.Config.Handler
	f.Add("/ipxe/"+in.ID.String(), "")
	f.Add("/ipxe/"+in.ID.String(), "a=b&token=tbt_x")
	f.Add("/ipxe/../ipxe/"+in.ID.String(), "")
	f.Add("/ipxe/..%2f..%2fetc", "")
	f.Add("/artifacts/sha256:"+strings.Repeat("0", 64), "")
	f.Add("/artifacts/"+fx.svc.Artifacts.Kernel, "x=%zz")
	f.Add("//ipxe//"+in.ID.String()+"/", ";;")
	f.Add("/uki/boot", "mac=52:54:00:12:34:56")
	f.Add("/uki/handoff", "mac=52:54:00:12:34:56&mac=x")
	served := 0
	f.Fuzz(func(t *testing.T, path, query string) {
		u := &url.URL{Path: path, RawQuery: query}
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.URL = u
		req.RequestURI = u.RequestURI()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		body := rec.Body.String()
		switch rec.Code {
		case http.StatusOK, http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusBadRequest,
			http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusConflict, http.StatusGone:
		default:
			t.Fatalf("GET %q ?%q: status %d: %s", path, query, rec.Code, body)
		}
		if servesToken(body, path, query) {
			if rec.Code != http.StatusOK || path != netboot.ScriptPath(in.ID.String()) {
				t.Fatalf("GET %q ?%q (%d) answered with a token", path, query, rec.Code)
			}
			served++
			if served > 1 {
				t.Fatalf("a second token was served in one boot (GET %q ?%q)", path, query)
			}
		}
	})
}

// FuzzAnnounce sends fuzzed bodies to the announce route: no panic, no
// 500, only a recorded announcement, a refusal naming the problem, or a
// body past the cap; and nothing but a well-formed announcement of an
// unknown MAC is recorded.
func FuzzAnnounce(f *testing.F) {
	fx := setup(f)
	fx.nb.Announce = true
	ek, _, _ := fakeEK(f)
	good, _ := proto.Marshal(&v1.NetbootAnnounce{Mac: unknownMAC, EkPublic: ek})
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte("\x0a\x11" + unknownMAC + "\x12\x00"))
	f.Add(append(good, 0x1a, 0x05, 'x', 'x', 'x', 'x', 'x'))
	h := fx.nb.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, netboot.AnnouncePath, bytes.NewReader(body))
		req.RemoteAddr = "10.0.0.1:68"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
		if rec.Code != http.StatusOK {
			return
		}
		var a v1.NetbootAnnounce
		if err := proto.Unmarshal(body, &a); err != nil {
			t.Fatalf("a body that is no announcement was accepted: %x", body)
		}
	})
}
