package events_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
)

func TestParseKind(t *testing.T) {
	for _, k := range events.Kinds() {
		if got, err := events.ParseKind(k.String()); err != nil || got != k {
			t.Errorf("ParseKind(%q) = %q, %v", k, got, err)
		}
	}
	for _, bad := range []string{"", "instance", "instance.unknown", "Instance.Silent", "instance.silent "} {
		_, err := events.ParseKind(bad)
		if err == nil || !errors.Is(err, store.ErrUnknownValue) || !strings.Contains(err.Error(), `"`+bad+`"`) {
			t.Errorf("ParseKind(%q) = %v; want an ErrUnknownValue naming it", bad, err)
		}
	}
}

// appender records what reaches the store.
type appender struct {
	store.EventQueries
	got []*store.Event
}

func (a *appender) AppendEvent(_ context.Context, e *store.Event) error {
	a.got = append(a.got, e)
	return nil
}

func (a *appender) AppendEvents(_ context.Context, es []*store.Event) error {
	a.got = append(a.got, es...)
	return nil
}

// TestWriteChecksTheKind: a kind outside the vocabulary is a programming
// error, refused before anything is written; an unset severity is low.
func TestWriteChecksTheKind(t *testing.T) {
	ctx, now := context.Background(), time.Unix(1700000000, 0).UTC()
	tests := []struct {
		name    string
		write   func(q store.EventQueries) error
		wantErr string
		wantN   int
	}{
		{"known kind", func(q store.EventQueries) error {
			_, err := events.E{Kind: events.InstanceSilent}.Write(ctx, q, now)
			return err
		}, "", 1},
		{"unknown kind", func(q store.EventQueries) error {
			_, err := events.E{Kind: "instance.silence"}.Write(ctx, q, now)
			return err
		}, `event kind "instance.silence"`, 0},
		{"one unknown kind of many", func(q store.EventQueries) error {
			_, err := events.WriteAll(ctx, q, now, events.E{Kind: events.PoolClaimed}, events.E{Kind: "pool.claim"})
			return err
		}, `event kind "pool.claim"`, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := &appender{}
			err := tc.write(a)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("err = %v, want one naming %s", err, tc.wantErr)
			}
			if len(a.got) != tc.wantN {
				t.Fatalf("%d events written, want %d", len(a.got), tc.wantN)
			}
			for _, e := range a.got {
				if e.Severity != store.SeverityLow {
					t.Errorf("severity %s, want low when unset", e.Severity)
				}
			}
		})
	}
}
