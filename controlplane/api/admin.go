package api

import (
	"fmt"

	adminca "github.com/tetherfleet/tether/controlplane/api/admin/ca"
	admincatalog "github.com/tetherfleet/tether/controlplane/api/admin/catalog"
	"github.com/tetherfleet/tether/controlplane/api/admin/credentials"
	adminevents "github.com/tetherfleet/tether/controlplane/api/admin/events"
	"github.com/tetherfleet/tether/controlplane/api/admin/fleet"
	"github.com/tetherfleet/tether/controlplane/api/admin/identities"
	"github.com/tetherfleet/tether/controlplane/api/admin/lifecycle"
	"github.com/tetherfleet/tether/controlplane/api/admin/pools"
	"github.com/tetherfleet/tether/controlplane/api/admin/signers"
	admintasks "github.com/tetherfleet/tether/controlplane/api/admin/tasks"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// The one registered AdminService is composed of the resource servers
// under admin/, each built from only the part of Config it uses
// (docs/adr/0047).
//
// Embedded at depth one, a resource's methods win over the
// Unimplemented ones, which sit at depth two (inside unimplementedAdmin),
// so the two never collide; two resources that both define a method
// would, and the build fails. The aliases give each embedded Server its
// own field name.
type (
	poolsAPI       = pools.Server
	caAPI          = adminca.Server
	signersAPI     = signers.Server
	identitiesAPI  = identities.Server
	credentialsAPI = credentials.Server
	lifecycleAPI   = lifecycle.Server
	tasksAPI       = admintasks.Server
	eventsAPI      = adminevents.Server
	catalogAPI     = admincatalog.Server
	fleetAPI       = fleet.Server
)

type adminServer struct {
	unimplementedAdmin
	*poolsAPI
	*caAPI
	*signersAPI
	*identitiesAPI
	*credentialsAPI
	*lifecycleAPI
	*tasksAPI
	*eventsAPI
	*catalogAPI
	*fleetAPI
}

type unimplementedAdmin struct {
	v1.UnimplementedAdminServiceServer
}

// newAdminServer builds each resource server from its narrow config.
func newAdminServer(cfg Config) (*adminServer, error) {
	a := &adminServer{}
	var err error
	if a.poolsAPI, err = pools.New(pools.Config{Pools: cfg.Pools}); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	if a.caAPI, err = adminca.New(adminca.Config{CAs: cfg.CAs}); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	if a.signersAPI, err = signers.New(signers.Config{Registry: cfg.Registry}); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	ids := identities.Config{Certificates: cfg.Certificates, Reads: cfg.Store, Clock: cfg.Clock}
	if cfg.Revoked != nil {
		ids.Revoked = cfg.Revoked
	}
	if a.identitiesAPI, err = identities.New(ids); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	if a.credentialsAPI, err = credentials.New(credentials.Config{Credentials: cfg.Credentials}); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	lc := lifecycle.Config{Instances: cfg.Instances, Reads: cfg.Store, Clock: cfg.Clock}
	if cfg.Revoked != nil {
		lc.Revoked = cfg.Revoked
	}
	if a.lifecycleAPI, err = lifecycle.New(lc); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	if a.tasksAPI, err = admintasks.New(admintasks.Config{Tasks: cfg.Tasks, Store: cfg.Store}); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	if a.eventsAPI, err = adminevents.New(adminevents.Config{Store: cfg.Store}); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	if a.catalogAPI, err = admincatalog.New(admincatalog.Config{Catalog: cfg.Catalog, Registry: cfg.Registry, Store: cfg.Store, Log: cfg.Log}); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	fl := fleet.Config{Instances: cfg.Instances, Certificates: cfg.Certificates, Reads: cfg.Store, Clock: cfg.Clock, AgentURL: cfg.AgentURL}
	if cfg.CA != nil {
		fl.CAFingerprint = cfg.CA.Fingerprint
	}
	if cfg.Revoked != nil {
		fl.Revoked = cfg.Revoked
	}
	if a.fleetAPI, err = fleet.New(fl); err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	return a, nil
}
