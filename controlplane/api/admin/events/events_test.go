package events_test

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	adminevents "github.com/tetherfleet/tether/controlplane/api/admin/events"
	"github.com/tetherfleet/tether/internal/testkit/admintest"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// serve starts only the event RPCs, over a real store whose log holds
// what creating one instance wrote.
func serve(t *testing.T) (*adminevents.Server, string) {
	t.Helper()
	env := admintest.New(t)
	in := env.Instance(t, "n1")
	s, err := adminevents.New(adminevents.Config{Store: env.Store})
	if err != nil {
		t.Fatal(err)
	}
	return s, in.ID.String()
}

func TestEventRPCs(t *testing.T) {
	s, id := serve(t)
	ctx := admintest.As("vera", adminkit.RoleViewer)
	all, err := s.ListEvents(ctx, &v1.ListEventsRequest{InstanceId: id})
	if err != nil || len(all.Events) == 0 {
		t.Fatalf("ListEvents = %v, %v; want the instance's events", all, err)
	}
	for _, e := range all.Events {
		if e.InstanceId != id {
			t.Fatalf("event %v is not the instance's", e)
		}
	}
	first, err := s.ListEvents(ctx, &v1.ListEventsRequest{InstanceId: id, PageSize: 1})
	if err != nil || len(first.Events) != 1 || (len(all.Events) > 1) != (first.NextPageToken != "") {
		t.Fatalf("a page of one = %v, %v; want one event and a token when there are more", first, err)
	}
}

func TestEventRPCsRefuseBadInput(t *testing.T) {
	s, _ := serve(t)
	ctx := admintest.As("vera", adminkit.RoleViewer)
	long := strings.Repeat("k", 300)
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"a token this server did not issue", func() error {
			_, err := s.ListEvents(ctx, &v1.ListEventsRequest{PageToken: "abc"})
			return err
		}, "page_token"},
		{"a long kind", func() error {
			_, err := s.ListEvents(ctx, &v1.ListEventsRequest{Kind: long})
			return err
		}, "kind"},
		{"a long correlation id", func() error {
			_, err := s.ListEvents(ctx, &v1.ListEventsRequest{CorrelationId: long})
			return err
		}, "correlation_id"},
		{"a severity the proto does not name", func() error {
			_, err := s.ListEvents(ctx, &v1.ListEventsRequest{MinSeverity: v1.Severity(99)})
			return err
		}, "min_severity"},
		{"watch with a severity the proto does not name", func() error {
			return s.WatchEvents(&v1.WatchEventsRequest{MinSeverity: v1.Severity(99)}, nil)
		}, "min_severity"},
		{"watch with a long pool id", func() error {
			return s.WatchEvents(&v1.WatchEventsRequest{PoolId: long}, nil)
		}, "pool_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			admintest.WantInvalid(t, err, tt.field)
		})
	}
}

func TestNewNamesTheStore(t *testing.T) {
	if _, err := adminevents.New(adminevents.Config{}); err == nil || !strings.Contains(err.Error(), "Config.Store") {
		t.Fatalf("New = %v; want the missing Store named", err)
	}
}
