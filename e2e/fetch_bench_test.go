package e2e

import (
	"context"
	"crypto/rand"
	"os"
	"testing"
	"testing/fstest"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/modules"
	"github.com/tetherfleet/tether/agent/modules/fetchbench"
	"github.com/tetherfleet/tether/internal/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// BenchmarkFetchVerifyTetherd is modules.BenchmarkFetchVerify against the
// real tetherd (in-process, real TLS on loopback, the real FetchModule):
// an enrolled agent fetches and verifies a 64 MiB module, reported against
// in-memory SHA-256 of the same bytes (see fetchbench.Run).
//
//	go test -tags nobadger,nobbolt,nomysql -run '^$' -bench FetchVerifyTetherd -benchtime 10x ./e2e/
func BenchmarkFetchVerifyTetherd(b *testing.B) {
	cp := testcp.Start(b)
	ctx := context.Background()
	payload := make([]byte, 64<<20)
	if _, err := rand.Read(payload); err != nil {
		b.Fatal(err)
	}
	img := testcp.BuildErofs(fstest.MapFS{"payload": {Data: payload}})
	cp.PushModule(ctx, "bench", "1", img)
	if _, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "bench", RootModules: []*v1.ModuleRef{{Name: "bench", Version: "1"}}}); err != nil {
		b.Fatal(err)
	}
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "bench", Template: "bench"}); err != nil {
		b.Fatal(err)
	}
	_, token := cp.Provision(ctx, "bench")

	// Enroll and dial as the agent does.
	m, err := enroll.New(enroll.Config{StateDir: b.TempDir(), URL: "https://" + cp.Addr, CAFingerprint: cp.Fingerprint()})
	if err != nil {
		b.Fatal(err)
	}
	ec, err := m.Dial(false)
	if err != nil {
		b.Fatal(err)
	}
	defer ec.Close()
	if _, err := m.Enroll(ctx, v1.NewEnrollmentServiceClient(ec), token); err != nil {
		b.Fatal(err)
	}
	conn, err := m.Dial(true)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := v1.NewAgentServiceClient(conn)
	as, err := client.GetAssignment(ctx, &v1.GetAssignmentRequest{})
	if err != nil || len(as.RootModules) != 1 {
		b.Fatalf("assignment: %v %v", as, err)
	}
	mod := as.RootModules[0]
	f, err := modules.New(modules.Config{Dir: fetchbench.Dir(b), Client: func() v1.AgentServiceClient { return client }})
	if err != nil {
		b.Fatal(err)
	}
	path, err := f.Path(mod.Digest)
	if err != nil {
		b.Fatal(err)
	}
	fetchbench.Run(b, img,
		func() error {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				return err
			}
			return nil
		},
		func() error {
			_, err := f.Fetch(ctx, mod)
			return err
		})
}
