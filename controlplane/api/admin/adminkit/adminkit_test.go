package adminkit

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
)

func TestPageAndMaskRefuseNamingTheField(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		field string
	}{
		{"negative size", func() error { _, err := Page(-1, ""); return err }(), "page_size"},
		{"size over the cap", func() error { _, err := Page(store.MaxPageSize+1, ""); return err }(), "page_size"},
		{"long token", func() error { _, err := Page(0, strings.Repeat("x", 257)); return err }(), "page_token"},
		{"empty mask", func() error { _, err := UpdateMask(nil, "a"); return err }(), "update_mask"},
		{"unknown field", func() error { _, err := UpdateMask([]string{"b"}, "a"); return err }(), "update_mask"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if status.Code(tt.err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(tt.err).Message(), tt.field+":") {
				t.Fatalf("err = %v; want InvalidArgument naming %s", tt.err, tt.field)
			}
		})
	}
	p, err := Page(0, "after")
	if err != nil || p.Limit <= 0 || p.After != "after" {
		t.Fatalf("Page(0, after) = %+v, %v; want the default limit after the token", p, err)
	}
	m, err := UpdateMask([]string{"a"}, "a", "b")
	if err != nil || !m["a"] || m["b"] {
		t.Fatalf("UpdateMask = %v, %v; want only a", m, err)
	}
}

func TestNeedsAdmin(t *testing.T) {
	as := func(role store.Role) context.Context {
		return WithCaller(context.Background(), Caller{Identity: pki.Identity{Kind: pki.KindAdmin, Name: "ann", Role: role.String()}})
	}
	tests := []struct {
		name string
		ctx  context.Context
		want codes.Code
	}{
		{"no caller", context.Background(), codes.PermissionDenied},
		{"viewer", as(RoleViewer), codes.PermissionDenied},
		{"operator", as(RoleOperator), codes.PermissionDenied},
		{"unknown role", as("root"), codes.PermissionDenied},
		{"admin", as(RoleAdmin), codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := NeedsAdmin(tt.ctx, "bmc", "why")
			if status.Code(err) != tt.want {
				t.Fatalf("NeedsAdmin = %v; want %v", err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), "bmc") {
				t.Fatalf("NeedsAdmin = %v; want it to name what was set", err)
			}
		})
	}
	if CallerName(context.Background()) != "unknown" || CallerName(as(RoleAdmin)) != "ann" || By(context.Background()) != "" {
		t.Fatal("CallerName/By do not name the caller")
	}
}
