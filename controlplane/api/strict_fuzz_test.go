package api

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// requestTypes is every message a client sends to a Tether service: the
// input of each method of each service, unary or streamed.
func requestTypes(tb testing.TB) []protoreflect.MessageType {
	tb.Helper()
	seen := map[protoreflect.FullName]bool{}
	var out []protoreflect.MessageType
	for _, fd := range []protoreflect.FileDescriptor{v1.File_tether_v1_admin_proto, v1.File_tether_v1_agent_proto, v1.File_tether_v1_enrollment_proto} {
		for i := 0; i < fd.Services().Len(); i++ {
			ms := fd.Services().Get(i).Methods()
			for j := 0; j < ms.Len(); j++ {
				name := ms.Get(j).Input().FullName()
				if seen[name] {
					continue
				}
				seen[name] = true
				mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
				if err != nil {
					tb.Fatalf("request type %s is not registered: %v", name, err)
				}
				out = append(out, mt)
			}
		}
	}
	if len(out) < 40 {
		tb.Fatalf("found only %d request types: the service walk is broken", len(out))
	}
	return out
}

// FuzzStrictRequest feeds wire bytes to every request type and checks the
// strict-input rule (docs/design.md §0.2): whatever checkStrict accepts
// loses nothing when unknown data is discarded, and every refusal is
// InvalidArgument, never Unknown or a panic.
func FuzzStrictRequest(f *testing.F) {
	types := requestTypes(f)
	for i, mt := range types {
		empty, _ := proto.Marshal(mt.New().Interface())
		f.Add(uint16(i), empty)
		unknown := protowire.AppendTag(nil, 999, protowire.VarintType)
		f.Add(uint16(i), protowire.AppendVarint(unknown, 7))
		// Field 1 as a string and as a varint: one of them is usually known.
		f.Add(uint16(i), protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "x"))
		f.Add(uint16(i), protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 99))
	}
	f.Fuzz(func(t *testing.T, which uint16, wire []byte) {
		mt := types[int(which)%len(types)]
		m := mt.New().Interface()
		if err := proto.Unmarshal(wire, m); err != nil {
			return // gRPC refuses undecodable bytes before any interceptor
		}
		err := checkStrict(m)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Fatalf("%s: refusal has code %v, want InvalidArgument: %v", mt.Descriptor().FullName(), c, err)
			}
			return
		}
		lenient := mt.New().Interface()
		if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(wire, lenient); err != nil {
			t.Fatalf("%s: lenient decode failed where strict decode passed: %v", mt.Descriptor().FullName(), err)
		}
		if !proto.Equal(m, lenient) {
			t.Fatalf("%s: checkStrict accepted a message that carried unknown fields", mt.Descriptor().FullName())
		}
	})
}
