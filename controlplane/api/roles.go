package api

import (
	"strings"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/store"
)

// Roles, weakest first (store.Role). The role is in the admin certificate.
const (
	RoleViewer   = adminkit.RoleViewer
	RoleOperator = adminkit.RoleOperator
	RoleAdmin    = adminkit.RoleAdmin
)

// access is what one admin RPC needs and whether it leaves an audit record.
type access struct {
	role store.Role
	// audit: every call that changes something, and reads of
	// certificates, identities, tokens and the audit trail itself.
	audit bool
}

func read(role store.Role) access  { return access{role: role} }
func write(role store.Role) access { return access{role: role, audit: true} }

// rpcAccess is the one table of every AdminService RPC: the lowest role
// allowed. Viewers read; operators drive templates, nodes, instances,
// pools and tasks; admins also manage certificates, tokens, modules,
// signers, identities and read the audit trail. A method missing here is
// refused (a test keeps the table complete against the service descriptor).
var rpcAccess = map[string]access{
	"CreateTemplate": write(RoleOperator),
	"GetTemplate":    read(RoleViewer),
	"ListTemplates":  read(RoleViewer),
	"UpdateTemplate": write(RoleOperator),
	"DeleteTemplate": write(RoleOperator),

	"PushModule":   write(RoleAdmin),
	"GetModule":    read(RoleViewer),
	"ListModules":  read(RoleViewer),
	"DeleteModule": write(RoleAdmin),

	"CreateNode": write(RoleOperator),
	"GetNode":    read(RoleViewer),
	"ListNodes":  read(RoleViewer),
	"UpdateNode": write(RoleOperator),
	"DeleteNode": write(RoleOperator),
	// Adopting binds an EK (docs/adr/0024, 0030).
	"AdoptNode": write(RoleAdmin),

	"ProvisionInstance":  write(RoleOperator),
	"GetInstance":        read(RoleViewer),
	"ListInstances":      read(RoleViewer),
	"StartInstance":      write(RoleOperator),
	"StopInstance":       write(RoleOperator),
	"RebootInstance":     write(RoleOperator),
	"TerminateInstance":  write(RoleOperator),
	"HoldInstance":       write(RoleOperator),
	"UnholdInstance":     write(RoleOperator),
	"CordonInstance":     write(RoleOperator),
	"UncordonInstance":   write(RoleOperator),
	"DrainInstance":      write(RoleOperator),
	"GetInstanceConsole": read(RoleViewer),
	"CreateSeedISO":      write(RoleAdmin), // carries a bootstrap token

	"CreateBootstrapToken": write(RoleAdmin),
	"ListCertificates":     {role: RoleAdmin, audit: true}, // certificates are identity material (design §3.6)
	"RevokeCertificate":    write(RoleAdmin),
	// CA rotation (design §3.10).
	"PrepareCA":  write(RoleAdmin),
	"ActivateCA": write(RoleAdmin),
	"RetireCA":   write(RoleAdmin),
	"ListCAs":    {role: RoleAdmin, audit: true},

	"CreateTask": write(RoleOperator),
	"GetTask":    read(RoleViewer),
	"ListTasks":  read(RoleViewer),
	"CancelTask": write(RoleOperator),

	"CreatePool":        write(RoleOperator),
	"GetPool":           read(RoleViewer),
	"ListPools":         read(RoleViewer),
	"UpdatePool":        write(RoleOperator),
	"PausePool":         write(RoleOperator),
	"ActivatePool":      write(RoleOperator),
	"DrainPool":         write(RoleOperator),
	"DeletePool":        write(RoleOperator),
	"ReplenishPool":     write(RoleOperator),
	"RecyclePool":       write(RoleOperator),
	"AcquirePoolMember": write(RoleOperator),
	"ReleasePoolMember": write(RoleOperator),

	"ListEvents":  read(RoleViewer),
	"WatchEvents": read(RoleViewer),

	"AddSigner":    write(RoleAdmin),
	"ListSigners":  read(RoleViewer),
	"RemoveSigner": write(RoleAdmin),
	"SignModule":   write(RoleAdmin),

	"CreateIdentity": write(RoleAdmin),
	"ListIdentities": {role: RoleAdmin, audit: true},
	"RevokeIdentity": write(RoleAdmin),
	// Any identity renews its own certificate, and nothing else.
	"RenewIdentity": write(RoleViewer),

	"ListAudit": {role: RoleAdmin, audit: true},

	// Credentials open machines' BMCs: admins manage them; listing (names
	// and user names, never passwords) is audited.
	"CreateCredential": write(RoleAdmin),
	"ListCredentials":  {role: RoleOperator, audit: true},
	"UpdateCredential": write(RoleAdmin),
	"DeleteCredential": write(RoleAdmin),
}

// accessOf looks a full method name up in the table.
func accessOf(method string) (access, bool) {
	a, ok := rpcAccess[method[strings.LastIndex(method, "/")+1:]]
	return a, ok
}

// RoleFor is the lowest role allowed to call an AdminService method (its
// short or full name); ok is false for a method missing from the table.
func RoleFor(method string) (role string, ok bool) {
	a, ok := accessOf(method)
	return a.role.String(), ok
}
