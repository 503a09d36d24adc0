package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/backup"
	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/tools/bench"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// A backup taken while tetherd serves and writes restores into a new data
// dir that another tetherd serves: agents enrolled before the backup keep
// their certificates (the CA is the same), what the backup held is there,
// what came after it is not, and the first start says so in an event.
func TestBackupUnderLoadRestoresIntoANewControlPlane(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cp := testcp.Start(t)
	fleet := cp.SeedFleet(ctx, "bk")
	enroll := v1.NewEnrollmentServiceClient(cp.Dial(nil))
	before, err := bench.EnrollAgents(ctx, cp.Admin, enroll, fleet.Node, 3)
	if err != nil {
		t.Fatal(err)
	}

	// Writes go on beside the backup: provisions, each a token, an event
	// and an audit record.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var loadErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: fleet.Node, Provider: "external"}); err != nil {
				loadErr = err
				return
			}
		}
	}()
	out := filepath.Join(t.TempDir(), "tether.backup")
	m, err := daemon.Backup(ctx, daemon.BackupOptions{DataDir: cp.DataDir, Out: out})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("backup under load: %v", err)
	}
	if loadErr != nil {
		t.Fatalf("a write beside the backup failed: %v", loadErr)
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("backup file: %v, mode %v; want 0600", err, st.Mode().Perm())
	}
	if m.SchemaVersion == 0 || m.CAFingerprint != cp.Fingerprint() {
		t.Fatalf("manifest: schema %d, CA %s; want a schema and CA %s", m.SchemaVersion, m.CAFingerprint, cp.Fingerprint())
	}

	after, err := bench.EnrollAgents(ctx, cp.Admin, enroll, fleet.Node, 1)
	if err != nil {
		t.Fatal(err)
	}

	dir := filepath.Join(t.TempDir(), "restored")
	if _, err := daemon.Restore(ctx, out, dir, backup.Decryption{}, nil); err != nil {
		t.Fatalf("restore: %v", err)
	}
	restored := testcp.Start(t, testcp.WithDataDir(dir))
	if restored.Fingerprint() != cp.Fingerprint() {
		t.Fatalf("restored CA %s, want %s", restored.Fingerprint(), cp.Fingerprint())
	}

	for _, a := range before {
		if _, err := v1.NewAgentServiceClient(restored.Dial(&a.Cert)).GetAssignment(ctx, &v1.GetAssignmentRequest{}); err != nil {
			t.Errorf("agent %s enrolled before the backup: %v", a.InstanceID, err)
		}
	}
	_, err = v1.NewAgentServiceClient(restored.Dial(&after[0].Cert)).GetAssignment(ctx, &v1.GetAssignmentRequest{})
	t.Logf("agent enrolled after the backup: %v", err)
	if code := status.Code(err); code == codes.OK {
		t.Errorf("agent %s enrolled after the backup was served by the restored control plane", after[0].InstanceID)
	}
	if _, err := restored.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: after[0].InstanceID}); status.Code(err) != codes.NotFound {
		t.Errorf("instance provisioned after the backup: %v, want NotFound", err)
	}

	ev := restoreEvents(ctx, t, restored)
	if len(ev) != 1 || ev[0].Severity != v1.Severity_SEVERITY_HIGH || !strings.Contains(ev[0].Message, "is lost") {
		t.Fatalf("restore events %v, want one high event saying what is lost", ev)
	}
	// The marker is gone: a restart records nothing more.
	restored.Restart()
	if ev := restoreEvents(ctx, t, restored); len(ev) != 1 {
		t.Fatalf("%d restore events after a restart, want 1", len(ev))
	}
}

func restoreEvents(ctx context.Context, t *testing.T, cp *testcp.ControlPlane) []*v1.FleetEvent {
	t.Helper()
	resp, err := cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: events.ControlPlaneRestored.String()})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Events
}
