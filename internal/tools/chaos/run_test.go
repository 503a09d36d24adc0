package chaos

import "testing"

func TestWithAppName(t *testing.T) {
	for _, c := range []struct{ dsn, want string }{
		{"postgres://postgres@/t_1?host=/tmp/pg&sslmode=disable", "postgres://postgres@/t_1?host=/tmp/pg&sslmode=disable&application_name=tetherd-0"},
		{"postgres://u@db:5432/tether", "postgres://u@db:5432/tether?application_name=tetherd-0"},
	} {
		if got := withAppName(c.dsn, "tetherd-0"); got != c.want {
			t.Errorf("withAppName(%q) = %q, want %q", c.dsn, got, c.want)
		}
	}
}

func TestProgressLineCountsWhatTheLoadDid(t *testing.T) {
	h := &harness{ledger: &Ledger{}, c: &Counters{}}
	h.c.Kills.Add(3)
	h.c.CallErrors.Add(7)
	h.ledger.Task("t-1")
	h.ledger.Claim(Claim{})
	h.ledger.Claim(Claim{})
	want := "3 kill -9, 0 database restarts, 0 agents enrolled, 0 provisions, 1 tasks created, 2 claims, 7 call errors"
	if got := h.progressLine(); got != want {
		t.Fatalf("progress line\n got %q\nwant %q", got, want)
	}
}
