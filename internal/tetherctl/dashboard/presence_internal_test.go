package dashboard

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func TestPresence(t *testing.T) {
	now := time.Date(2026, 12, 4, 4, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		p    *v1.AgentPresence
		want string
	}{
		{nil, "never connected"},
		{&v1.AgentPresence{Connected: true, Replica: "host/127.0.0.1:7443"}, "connected to replica host/127.0.0.1:7443"},
		{&v1.AgentPresence{Replica: "r", LostAt: timestamppb.New(now.Add(-12 * time.Second))}, "lost 12s ago"},
		{&v1.AgentPresence{Replica: "r"}, "not connected"},
	} {
		if got := presence(tc.p, now); got != tc.want {
			t.Errorf("presence(%v) = %q, want %q", tc.p, got, tc.want)
		}
	}
}
