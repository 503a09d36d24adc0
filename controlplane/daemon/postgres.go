package daemon

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
)

// openPostgres opens the PostgreSQL store a --store postgres://... URL
// names. It waits (up to a minute, backing off, logging each retry) for a
// server that is not up yet, as when tetherd and PostgreSQL start
// together, and applies the migrations under an advisory lock so that
// replicas may start at the same time.
func openPostgres(ctx context.Context, dsn string, log *slog.Logger) (store.Store, error) {
	s, err := postgres.Open(ctx, dsn, postgres.Options{Log: log})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	return s, nil
}
