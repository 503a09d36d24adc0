package api

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/catalog"
	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/tasks"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki/ca"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Every AdminService method is served by a resource or by adminServer
// itself: the composition embeds Unimplemented one level down, so a
// resource that lost a method (or a method left out of the composition)
// would otherwise answer Unimplemented quietly. Each method is called
// with an empty request over dependencies that are not there; a panic or
// any answer but Unimplemented shows a real handler was reached.
func TestEveryAdminMethodIsServed(t *testing.T) {
	var someStore struct{ store.Store } // never reached: each handler fails first
	authority, err := ca.Create(filepath.Join(t.TempDir(), "ca"), "compose", clock.NewFake(time.Time{}))
	if err != nil {
		t.Fatal(err)
	}
	a, err := newAdminServer(Config{Store: someStore, CA: authority, Catalog: &catalog.Service{}, Instances: &instances.Service{}, Tasks: &tasks.Service{}, Certificates: &certificates.Service{}, Registry: &modules.Registry{}, Revoked: NewRevocations(),
		Clock: clock.NewFake(time.Time{})})
	if err != nil {
		t.Fatal(err)
	}
	sd := v1.File_tether_v1_admin_proto.Services().ByName("AdminService")
	if sd == nil {
		t.Fatal("no AdminService in the descriptor")
	}
	v := reflect.ValueOf(a)
	methods := sd.Methods()
	for i := range methods.Len() {
		name := string(methods.Get(i).Name())
		t.Run(name, func(t *testing.T) {
			m := v.MethodByName(name)
			if !m.IsValid() {
				t.Fatalf("adminServer has no method %s", name)
			}
			if unimplemented(t, m) {
				t.Fatalf("%s answers Unimplemented: no resource serves it", name)
			}
		})
	}
}

// unimplemented calls m with zero arguments and reports whether it
// answered codes.Unimplemented.
func unimplemented(t *testing.T, m reflect.Value) (unimpl bool) {
	t.Helper()
	defer func() {
		if recover() != nil {
			unimpl = false // a real handler reached its missing dependency
		}
	}()
	mt := m.Type()
	args := make([]reflect.Value, mt.NumIn())
	for i := range args {
		in := mt.In(i)
		switch {
		case in == reflect.TypeOf((*context.Context)(nil)).Elem():
			args[i] = reflect.ValueOf(context.Background())
		case in.Kind() == reflect.Pointer:
			args[i] = reflect.New(in.Elem())
		default:
			args[i] = reflect.Zero(in)
		}
	}
	out := m.Call(args)
	errV := out[len(out)-1]
	if errV.IsNil() {
		return false
	}
	return status.Code(errV.Interface().(error)) == codes.Unimplemented
}
