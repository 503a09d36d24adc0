// Package adminkit is what the admin API's resource packages
// (controlplane/api/admin/...) share: the caller a call was authenticated
// as, the roles, conversion of stored rows to their proto form, list
// paging and update masks. It is a leaf below both controlplane/api, which
// puts the caller in the context, and the resource packages, which read
// it, so that no resource copies a helper and none imports the api
// package (docs/adr/0047).
package adminkit
