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
