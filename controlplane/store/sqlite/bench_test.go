package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/controlplane/store/storetest"
)

// BenchmarkRecordHeartbeats: see storetest.BenchRecordHeartbeats.
//
//	nice -n 10 go test -tags nobadger,nobbolt,nomysql -run '^$' -bench RecordHeartbeats -benchtime 2s -count 3 ./controlplane/store/sqlite/
func BenchmarkRecordHeartbeats(b *testing.B) {
	s, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "tether.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	// The server is this process: cpu-ns/heartbeat is all of it.
	storetest.BenchRecordHeartbeats(b, s, nil)
}

func BenchmarkStreamTaskCheck(b *testing.B) {
	s, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "tether.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	storetest.BenchStreamTaskCheck(b, s)
}
