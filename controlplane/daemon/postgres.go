package daemon

import (
	"context"
	"errors"
	"log/slog"

	"github.com/tetherfleet/tether/controlplane/store"
)

// openPostgres is replaced when the PostgreSQL backend lands.
func openPostgres(ctx context.Context, dsn string, log *slog.Logger) (store.Store, error) {
	return nil, errors.New("serve: the PostgreSQL backend is not built into this tetherd yet")
}
