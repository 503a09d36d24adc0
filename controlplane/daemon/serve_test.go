package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// guardedStore fails the test when anything uses the store after Close,
// or closes it twice. Its methods are every method of store.Store (written
// out by a generator from the interface; a method added to the interface
// later reaches the embedded store unguarded until it is added here).
type guardedStore struct {
	store.Store
	t      testing.TB
	mu     sync.Mutex
	closed bool
	closes int
}

func (g *guardedStore) use(method string) {
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	if closed {
		g.t.Errorf("store.%s called after Close", method)
	}
}

func (g *guardedStore) Close() error {
	g.mu.Lock()
	g.closed = true
	g.closes++
	g.mu.Unlock()
	return g.Store.Close()
}

func (g *guardedStore) closeCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closes
}

// trackedListener records its Close; broken makes Accept fail for good.
type trackedListener struct {
	net.Listener
	broken error
	closed atomic.Bool
}

func (l *trackedListener) Accept() (net.Conn, error) {
	if l.broken != nil {
		return nil, l.broken
	}
	return l.Listener.Accept()
}

func (l *trackedListener) Close() error {
	l.closed.Store(true)
	return l.Listener.Close()
}

func listen(t *testing.T, broken error) *trackedListener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &trackedListener{Listener: l, broken: broken}
}

// Every way Serve ends waits for its workers before the store closes,
// closes the store once, and leaves no listener open: the metrics listener
// that cannot listen (build fails), the gRPC server or the metrics server
// failing (run fails), and the context ending.
func TestServeEndsCleanly(t *testing.T) {
	busy := listen(t, nil) // an address already taken
	tests := []struct {
		name    string
		grpc    error  // Accept error of the gRPC listener
		metrics string // "busy", "broken" or "ok"
		cancel  bool
		wantErr string
	}{
		{"the metrics listener cannot listen", nil, "busy", false, "metrics listen on"},
		{"the gRPC server fails", errors.New("accept: listener broken"), "ok", false, "listener broken"},
		{"the metrics server fails", nil, "broken", false, "metrics server"},
		{"the context ends", nil, "ok", true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := Init(InitOptions{DataDir: dir}); err != nil {
				t.Fatal(err)
			}
			lis := listen(t, tc.grpc)
			o := ServeOptions{DataDir: dir, Test: TestHooks{Listener: lis},
				Providers: ProviderOptions{QEMU: QEMUOptions{Mode: "disabled", StateDir: filepath.Join(dir, "m")}},
				Log:       slog.New(slog.NewTextHandler(io.Discard, nil)), Loops: LoopOptions{Every: time.Millisecond, WorkerPoll: time.Millisecond}}
			var metrics *trackedListener
			switch tc.metrics {
			case "busy":
				o.Listeners.Metrics = busy.Addr().String()
			case "broken":
				metrics = listen(t, errors.New("accept: metrics listener broken"))
				o.Test.MetricsListener = metrics
			default:
				metrics = listen(t, nil)
				o.Test.MetricsListener = metrics
			}
			var guard *guardedStore
			o.Test.WrapStore = func(st store.Store) store.Store {
				guard = &guardedStore{Store: st, t: t}
				return guard
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ready := make(chan string, 1)
			o.Test.Ready = ready
			done := make(chan error, 1)
			go func() { done <- Serve(ctx, o) }()
			if tc.cancel {
				select {
				case <-ready:
				case err := <-done:
					t.Fatalf("Serve ended before serving: %v", err)
				}
				cancel()
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("Serve did not end")
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Serve = %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Serve = %v, want an error containing %q", err, tc.wantErr)
			}
			if guard == nil || guard.closeCount() != 1 {
				t.Fatalf("the store was not closed exactly once")
			}
			if !lis.closed.Load() {
				t.Error("the gRPC listener was left open")
			}
			if metrics != nil && !metrics.closed.Load() {
				t.Error("the metrics listener was left open")
			}
		})
	}
}

func (g *guardedStore) AppendEvent(a0 context.Context, a1 *store.Event) error {
	g.use("AppendEvent")
	return g.Store.AppendEvent(a0, a1)
}

func (g *guardedStore) AppendEvents(a0 context.Context, a1 []*store.Event) error {
	g.use("AppendEvents")
	return g.Store.AppendEvents(a0, a1)
}

func (g *guardedStore) Backend() string {
	g.use("Backend")
	return g.Store.Backend()
}

func (g *guardedStore) ClaimPoolMember(a0 context.Context, a1 store.PoolID, a2 string, a3 time.Time) (*store.Instance, error) {
	g.use("ClaimPoolMember")
	return g.Store.ClaimPoolMember(a0, a1, a2, a3)
}

func (g *guardedStore) ClaimPoolMembers(a0 context.Context, a1 store.PoolID, a2 string, a3 []store.PoolClaim, a4 time.Time) ([]*store.Instance, error) {
	g.use("ClaimPoolMembers")
	return g.Store.ClaimPoolMembers(a0, a1, a2, a3, a4)
}

func (g *guardedStore) ClaimTask(a0 context.Context, a1 store.TaskClaim) (*store.Task, error) {
	g.use("ClaimTask")
	return g.Store.ClaimTask(a0, a1)
}
func (g *guardedStore) ConsumeToken(a0 context.Context, a1, a2 string, a3 time.Time) (*store.Token, error) {
	g.use("ConsumeToken")
	return g.Store.ConsumeToken(a0, a1, a2, a3)
}

func (g *guardedStore) CountInstances(a0 context.Context, a1 store.InstanceFilter) (int, error) {
	g.use("CountInstances")
	return g.Store.CountInstances(a0, a1)
}

func (g *guardedStore) CountModulesWithDigest(a0 context.Context, a1 string) (int, error) {
	g.use("CountModulesWithDigest")
	return g.Store.CountModulesWithDigest(a0, a1)
}

func (g *guardedStore) CountPoolMembers(a0 context.Context, a1 store.PoolID) (store.PoolCounts, error) {
	g.use("CountPoolMembers")
	return g.Store.CountPoolMembers(a0, a1)
}

func (g *guardedStore) CreateCertificate(a0 context.Context, a1 *store.Certificate) error {
	g.use("CreateCertificate")
	return g.Store.CreateCertificate(a0, a1)
}

func (g *guardedStore) CreateInstance(a0 context.Context, a1 *store.Instance) error {
	g.use("CreateInstance")
	return g.Store.CreateInstance(a0, a1)
}

func (g *guardedStore) CreateModule(a0 context.Context, a1 *store.Module) error {
	g.use("CreateModule")
	return g.Store.CreateModule(a0, a1)
}

func (g *guardedStore) CreateNode(a0 context.Context, a1 *store.Node) error {
	g.use("CreateNode")
	return g.Store.CreateNode(a0, a1)
}

func (g *guardedStore) CreatePool(a0 context.Context, a1 *store.Pool) error {
	g.use("CreatePool")
	return g.Store.CreatePool(a0, a1)
}

func (g *guardedStore) CreateTask(a0 context.Context, a1 *store.Task) error {
	g.use("CreateTask")
	return g.Store.CreateTask(a0, a1)
}

func (g *guardedStore) CreateTemplate(a0 context.Context, a1 *store.Template) error {
	g.use("CreateTemplate")
	return g.Store.CreateTemplate(a0, a1)
}

func (g *guardedStore) CreateToken(a0 context.Context, a1 *store.Token) error {
	g.use("CreateToken")
	return g.Store.CreateToken(a0, a1)
}

func (g *guardedStore) DeleteModule(a0 context.Context, a1 string, a2 string) error {
	g.use("DeleteModule")
	return g.Store.DeleteModule(a0, a1, a2)
}

func (g *guardedStore) DeleteNode(a0 context.Context, a1 string) error {
	g.use("DeleteNode")
	return g.Store.DeleteNode(a0, a1)
}

func (g *guardedStore) DeletePool(a0 context.Context, a1 store.PoolID) error {
	g.use("DeletePool")
	return g.Store.DeletePool(a0, a1)
}

func (g *guardedStore) DeletePoolMember(a0 context.Context, a1 store.InstanceID) error {
	g.use("DeletePoolMember")
	return g.Store.DeletePoolMember(a0, a1)
}

func (g *guardedStore) DeleteTemplate(a0 context.Context, a1 string) error {
	g.use("DeleteTemplate")
	return g.Store.DeleteTemplate(a0, a1)
}

func (g *guardedStore) Elector() store.Elector {
	g.use("Elector")
	return g.Store.Elector()
}

func (g *guardedStore) ExpireInstanceTokens(a0 context.Context, a1 store.InstanceID, a2 time.Time) (int, error) {
	g.use("ExpireInstanceTokens")
	return g.Store.ExpireInstanceTokens(a0, a1, a2)
}

func (g *guardedStore) ExpireTaskLeases(a0 context.Context, a1 time.Time) ([]*store.Task, error) {
	g.use("ExpireTaskLeases")
	return g.Store.ExpireTaskLeases(a0, a1)
}

func (g *guardedStore) GetCertificate(a0 context.Context, a1 store.CertSerial) (*store.Certificate, error) {
	g.use("GetCertificate")
	return g.Store.GetCertificate(a0, a1)
}

func (g *guardedStore) GetInstance(a0 context.Context, a1 store.InstanceID) (*store.Instance, error) {
	g.use("GetInstance")
	return g.Store.GetInstance(a0, a1)
}

func (g *guardedStore) GetInstanceByOperationID(a0 context.Context, a1 string) (*store.Instance, error) {
	g.use("GetInstanceByOperationID")
	return g.Store.GetInstanceByOperationID(a0, a1)
}

func (g *guardedStore) GetModule(a0 context.Context, a1 string, a2 string) (*store.Module, error) {
	g.use("GetModule")
	return g.Store.GetModule(a0, a1, a2)
}

func (g *guardedStore) GetNode(a0 context.Context, a1 string) (*store.Node, error) {
	g.use("GetNode")
	return g.Store.GetNode(a0, a1)
}

func (g *guardedStore) GetNodeByID(a0 context.Context, a1 store.NodeID) (*store.Node, error) {
	g.use("GetNodeByID")
	return g.Store.GetNodeByID(a0, a1)
}

func (g *guardedStore) GetPool(a0 context.Context, a1 string) (*store.Pool, error) {
	g.use("GetPool")
	return g.Store.GetPool(a0, a1)
}

func (g *guardedStore) GetPoolByID(a0 context.Context, a1 store.PoolID) (*store.Pool, error) {
	g.use("GetPoolByID")
	return g.Store.GetPoolByID(a0, a1)
}

func (g *guardedStore) GetTask(a0 context.Context, a1 store.TaskID) (*store.Task, error) {
	g.use("GetTask")
	return g.Store.GetTask(a0, a1)
}

func (g *guardedStore) GetTemplate(a0 context.Context, a1 string) (*store.Template, error) {
	g.use("GetTemplate")
	return g.Store.GetTemplate(a0, a1)
}

func (g *guardedStore) GetTemplateByID(a0 context.Context, a1 store.TemplateID) (*store.Template, error) {
	g.use("GetTemplateByID")
	return g.Store.GetTemplateByID(a0, a1)
}

func (g *guardedStore) GetToken(a0 context.Context, a1 string) (*store.Token, error) {
	g.use("GetToken")
	return g.Store.GetToken(a0, a1)
}

func (g *guardedStore) LatestEventID(a0 context.Context) (int64, error) {
	g.use("LatestEventID")
	return g.Store.LatestEventID(a0)
}

func (g *guardedStore) ListCertificates(a0 context.Context, a1 store.CertificateFilter, a2 store.Page) ([]*store.Certificate, error) {
	g.use("ListCertificates")
	return g.Store.ListCertificates(a0, a1, a2)
}

func (g *guardedStore) ListEvents(a0 context.Context, a1 store.EventFilter, a2 store.Page) ([]*store.Event, error) {
	g.use("ListEvents")
	return g.Store.ListEvents(a0, a1, a2)
}

func (g *guardedStore) ListEventsSince(a0 context.Context, a1 store.EventFilter, a2 int64, a3 int) ([]*store.Event, error) {
	g.use("ListEventsSince")
	return g.Store.ListEventsSince(a0, a1, a2, a3)
}

func (g *guardedStore) ListInstances(a0 context.Context, a1 store.InstanceFilter, a2 store.Page) ([]*store.Instance, error) {
	g.use("ListInstances")
	return g.Store.ListInstances(a0, a1, a2)
}

func (g *guardedStore) ListModules(a0 context.Context, a1 string, a2 store.Page) ([]*store.Module, error) {
	g.use("ListModules")
	return g.Store.ListModules(a0, a1, a2)
}

func (g *guardedStore) ListNodes(a0 context.Context, a1 store.NodeFilter, a2 store.Page) ([]*store.Node, error) {
	g.use("ListNodes")
	return g.Store.ListNodes(a0, a1, a2)
}

func (g *guardedStore) ListPools(a0 context.Context, a1 store.Page) ([]*store.Pool, error) {
	g.use("ListPools")
	return g.Store.ListPools(a0, a1)
}

func (g *guardedStore) ListRevokedSerials(a0 context.Context, a1 time.Time) ([]store.CertSerial, error) {
	g.use("ListRevokedSerials")
	return g.Store.ListRevokedSerials(a0, a1)
}

func (g *guardedStore) ListTasks(a0 context.Context, a1 store.TaskFilter, a2 store.Page) ([]*store.Task, error) {
	g.use("ListTasks")
	return g.Store.ListTasks(a0, a1, a2)
}

func (g *guardedStore) ListTemplates(a0 context.Context, a1 store.Page) ([]*store.Template, error) {
	g.use("ListTemplates")
	return g.Store.ListTemplates(a0, a1)
}

func (g *guardedStore) LockInstance(a0 context.Context, a1 store.InstanceID) (*store.Instance, error) {
	g.use("LockInstance")
	return g.Store.LockInstance(a0, a1)
}

func (g *guardedStore) LockPool(a0 context.Context, a1 store.PoolID) (*store.Pool, error) {
	g.use("LockPool")
	return g.Store.LockPool(a0, a1)
}

func (g *guardedStore) LockTask(a0 context.Context, a1 store.TaskID) (*store.Task, error) {
	g.use("LockTask")
	return g.Store.LockTask(a0, a1)
}

func (g *guardedStore) Notify(a0 context.Context, a1 string, a2 string) error {
	g.use("Notify")
	return g.Store.Notify(a0, a1, a2)
}

func (g *guardedStore) PruneEvents(a0 context.Context, a1 time.Time, a2 time.Time, a3 int) (int64, error) {
	g.use("PruneEvents")
	return g.Store.PruneEvents(a0, a1, a2, a3)
}

func (g *guardedStore) PruneRecords(a0 context.Context, a1 time.Time, a2 time.Time, a3 time.Time, a4 int) (store.Pruned, error) {
	g.use("PruneRecords")
	return g.Store.PruneRecords(a0, a1, a2, a3, a4)
}

func (g *guardedStore) RecordHeartbeats(a0 context.Context, a1 []store.Heartbeat) error {
	g.use("RecordHeartbeats")
	return g.Store.RecordHeartbeats(a0, a1)
}

func (g *guardedStore) RevokeCertificate(a0 context.Context, a1 store.CertSerial, a2 string, a3 time.Time) (*store.Certificate, error) {
	g.use("RevokeCertificate")
	return g.Store.RevokeCertificate(a0, a1, a2, a3)
}

func (g *guardedStore) RevokeInstanceCertificates(a0 context.Context, a1 store.InstanceID, a2 string, a3 time.Time) ([]store.CertSerial, error) {
	g.use("RevokeInstanceCertificates")
	return g.Store.RevokeInstanceCertificates(a0, a1, a2, a3)
}

func (g *guardedStore) Subscribe(a0 string) (<-chan string, func()) {
	g.use("Subscribe")
	return g.Store.Subscribe(a0)
}

func (g *guardedStore) Tx(a0 context.Context, a1 func(q store.Queries) error) error {
	g.use("Tx")
	return g.Store.Tx(a0, a1)
}

func (g *guardedStore) UpdateInstance(a0 context.Context, a1 *store.Instance) error {
	g.use("UpdateInstance")
	return g.Store.UpdateInstance(a0, a1)
}

func (g *guardedStore) UpdateNode(a0 context.Context, a1 *store.Node) error {
	g.use("UpdateNode")
	return g.Store.UpdateNode(a0, a1)
}

func (g *guardedStore) UpdatePool(a0 context.Context, a1 *store.Pool) error {
	g.use("UpdatePool")
	return g.Store.UpdatePool(a0, a1)
}

func (g *guardedStore) UpdateTask(a0 context.Context, a1 *store.Task) error {
	g.use("UpdateTask")
	return g.Store.UpdateTask(a0, a1)
}

func (g *guardedStore) UpdateTemplate(a0 context.Context, a1 *store.Template) error {
	g.use("UpdateTemplate")
	return g.Store.UpdateTemplate(a0, a1)
}

func (g *guardedStore) OpenPresence(a0 context.Context, a1 *store.Presence) error {
	g.use("OpenPresence")
	return g.Store.OpenPresence(a0, a1)
}

func (g *guardedStore) ClosePresence(a0 context.Context, a1 store.InstanceID, a2 string, a3 time.Time) (bool, error) {
	g.use("ClosePresence")
	return g.Store.ClosePresence(a0, a1, a2, a3)
}

func (g *guardedStore) RenewPresence(a0 context.Context, a1 string, a2 time.Time) (int64, error) {
	g.use("RenewPresence")
	return g.Store.RenewPresence(a0, a1, a2)
}

func (g *guardedStore) ExpirePresence(a0 context.Context, a1 string, a2 time.Time) (int64, error) {
	g.use("ExpirePresence")
	return g.Store.ExpirePresence(a0, a1, a2)
}

func (g *guardedStore) ListPresence(a0 context.Context, a1 []store.InstanceID) (map[store.InstanceID]*store.Presence, error) {
	g.use("ListPresence")
	return g.Store.ListPresence(a0, a1)
}
