package bench

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"go.step.sm/crypto/jose"
)

// TestStepCATokens: the CA written for step-ca names a JWK provisioner
// whose public key verifies the tokens Mint makes, with the claims
// step-ca's JWK provisioner checks.
func TestStepCATokens(t *testing.T) {
	ca, err := InitStepCA(t.TempDir(), "127.0.0.1:9443")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(ca.Config)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Root, Crt, Key string
		DB             struct{ Type string } `json:"db"`
		Authority      struct {
			Provisioners []struct {
				Type, Name string
				Key        jose.JSONWebKey
			}
		}
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.DB.Type != "badgerv2" || len(cfg.Authority.Provisioners) != 1 || cfg.Authority.Provisioners[0].Type != "JWK" {
		t.Fatalf("ca.json: %s", raw)
	}
	for _, f := range []string{cfg.Root, cfg.Crt, cfg.Key} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("ca.json names %s: %v", f, err)
		}
	}
	pub := cfg.Authority.Provisioners[0].Key
	if !pub.IsPublic() {
		t.Fatal("the provisioner's key in ca.json is not a public key")
	}

	now := time.Now()
	tok, err := ca.Mint("n1.nodes.bench.internal", now, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := jose.ParseSigned(tok)
	if err != nil {
		t.Fatal(err)
	}
	if kid := parsed.Headers[0].KeyID; kid != pub.KeyID {
		t.Fatalf("token kid %q, provisioner key id %q", kid, pub.KeyID)
	}
	var claims ottClaims
	if err := parsed.Claims(pub.Key, &claims); err != nil {
		t.Fatalf("token does not verify with the provisioner's key: %v", err)
	}
	if err := claims.Claims.ValidateWithLeeway(jose.Expected{Issuer: StepCAProvisioner, Subject: "n1.nodes.bench.internal",
		Audience: jose.Audience{"https://127.0.0.1:9443/1.0/sign"}, Time: now}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if len(claims.ID) != 64 || len(claims.SANs) != 1 || claims.SANs[0] != "n1.nodes.bench.internal" {
		t.Fatalf("claims %+v", claims)
	}
	other, err := ca.Mint("n1.nodes.bench.internal", now, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	op, err := jose.ParseSigned(other)
	if err != nil {
		t.Fatal(err)
	}
	var oc ottClaims
	if err := op.Claims(pub.Key, &oc); err != nil || oc.ID == claims.ID {
		t.Fatalf("a second token for one name: jti %q (%v), the first's %q", oc.ID, err, claims.ID)
	}

	rs, err := ca.PrepareStep("t", 3)
	if err != nil || len(rs) != 3 || rs[2].Name != "t-00002.nodes.bench.internal" || !strings.Contains(string(rs[0].Body), `"ott"`) {
		t.Fatalf("PrepareStep = %+v, %v", rs, err)
	}
}
