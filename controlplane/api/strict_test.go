package api

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// withUnknown returns m carrying the bytes of an unknown field.
func withUnknown[M proto.Message](m M, raw []byte) M {
	m.ProtoReflect().SetUnknown(raw)
	return m
}

var unknown77 = protowire.AppendVarint(protowire.AppendTag(nil, 77, protowire.VarintType), 1)

// strictShapes is a message type with what no Tether message has: a
// repeated enum and maps with integer and bool keys.
func strictShapes(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	s := proto.String
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: s("strict_shapes.proto"), Package: s("stricttest"), Syntax: s("proto3"),
		EnumType: []*descriptorpb.EnumDescriptorProto{{Name: s("Color"),
			Value: []*descriptorpb.EnumValueDescriptorProto{{Name: s("COLOR_UNSPECIFIED"), Number: proto.Int32(0)}}}},
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: s("Shapes"),
			Field: []*descriptorpb.FieldDescriptorProto{
				{Name: s("colors"), Number: proto.Int32(1), Label: descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum(),
					Type: descriptorpb.FieldDescriptorProto_TYPE_ENUM.Enum(), TypeName: s(".stricttest.Color")},
				{Name: s("by_num"), Number: proto.Int32(2), Label: descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum(),
					Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: s(".stricttest.Shapes.ByNumEntry")},
				{Name: s("by_flag"), Number: proto.Int32(3), Label: descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum(),
					Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: s(".stricttest.Shapes.ByFlagEntry")},
			},
			NestedType: []*descriptorpb.DescriptorProto{
				{Name: s("ByNumEntry"), Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
					Field: []*descriptorpb.FieldDescriptorProto{
						{Name: s("key"), Number: proto.Int32(1), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: descriptorpb.FieldDescriptorProto_TYPE_INT32.Enum()},
						{Name: s("value"), Number: proto.Int32(2), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
							Type: descriptorpb.FieldDescriptorProto_TYPE_ENUM.Enum(), TypeName: s(".stricttest.Color")},
					}},
				{Name: s("ByFlagEntry"), Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
					Field: []*descriptorpb.FieldDescriptorProto{
						{Name: s("key"), Number: proto.Int32(1), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: descriptorpb.FieldDescriptorProto_TYPE_BOOL.Enum()},
						{Name: s("value"), Number: proto.Int32(2), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
							Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: s(".stricttest.Shapes")},
					}},
			},
		}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fd.Messages().ByName("Shapes")
}

// TestCheckStrictNamesTheField pins each refusal's text: the path from the
// top message to the offending field, list index or map key included.
func TestCheckStrictNamesTheField(t *testing.T) {
	shapes := strictShapes(t)
	colors, byNum, byFlag := shapes.Fields().ByName("colors"), shapes.Fields().ByName("by_num"), shapes.Fields().ByName("by_flag")
	// Shapes{colors: [0, 0, 5]}
	badList := dynamicpb.NewMessage(shapes)
	l := badList.Mutable(colors).List()
	for _, n := range []protoreflect.EnumNumber{0, 0, 5} {
		l.Append(protoreflect.ValueOfEnum(n))
	}
	// Shapes{by_num: {-3: 9}}
	badIntKey := dynamicpb.NewMessage(shapes)
	badIntKey.Mutable(byNum).Map().Set(protoreflect.ValueOfInt32(-3).MapKey(), protoreflect.ValueOfEnum(9))
	// Shapes{by_flag: {true: Shapes{colors: [0, 4]}}}
	inner := dynamicpb.NewMessage(shapes)
	inner.Mutable(colors).List().Append(protoreflect.ValueOfEnum(0))
	inner.Mutable(colors).List().Append(protoreflect.ValueOfEnum(4))
	badBoolKey := dynamicpb.NewMessage(shapes)
	badBoolKey.Mutable(byFlag).Map().Set(protoreflect.ValueOfBool(true).MapKey(), protoreflect.ValueOfMessage(inner))

	members := func(last *v1.PoolMember) []*v1.PoolMember {
		return []*v1.PoolMember{{Status: v1.InstanceStatus_INSTANCE_STATUS_RUNNING}, {NodeName: "n1"}, last}
	}
	config := &structpb.Struct{Fields: map[string]*structpb.Value{"k": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{
		structpb.NewStringValue("a"), structpb.NewBoolValue(true), {Kind: &structpb.Value_NullValue{NullValue: 7}}}})}}
	for _, tc := range []struct {
		name string
		m    proto.Message
		want string // the status message; empty: accepted
	}{
		{"a heartbeat", testHeartbeat(), ""},
		{"an enum field", &v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{Phase: 99}}},
			"AgentMessage.heartbeat.phase: unknown AgentPhase value 99"},
		{"an enum in a list element of a nested message",
			&v1.ListPoolsResponse{Pools: []*v1.Pool{{Name: "p0"}, {Name: "p1", Members: members(&v1.PoolMember{Status: 42})}}},
			"ListPoolsResponse.pools[1].members[2].status: unknown InstanceStatus value 42"},
		{"an enum under a string map key and a list", &v1.CreateNodeRequest{Name: "n", Config: config},
			"CreateNodeRequest.config.fields[k].list_value.values[2].null_value: unknown NullValue value 7"},
		{"an enum list element", badList, "Shapes.colors[2]: unknown Color value 5"},
		{"an enum map value under an int key", badIntKey, "Shapes.by_num[-3]: unknown Color value 9"},
		{"an enum list in a message under a bool key", badBoolKey, "Shapes.by_flag[true].colors[1]: unknown Color value 4"},
		{"an unknown field at the top", withUnknown(testHeartbeat(), unknown77),
			"AgentMessage: unknown field number 77 (this server does not know it; check the client and server versions)"},
		{"an unknown field in a list element",
			&v1.ListPoolsResponse{Pools: []*v1.Pool{{Name: "p0", Members: members(withUnknown(&v1.PoolMember{}, unknown77))}}},
			"ListPoolsResponse.pools[0].members[2]: unknown field number 77 (this server does not know it; check the client and server versions)"},
		{"malformed unknown data", &v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: withUnknown(&v1.Heartbeat{}, []byte{0xff})}},
			"AgentMessage.heartbeat: malformed unknown field data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkStrict(tc.m)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if s := status.Convert(err); s.Code() != codes.InvalidArgument || s.Message() != tc.want {
				t.Fatalf("got %v %q\nwant InvalidArgument %q", s.Code(), s.Message(), tc.want)
			}
		})
	}
}

// testHeartbeat is what an agent sends every interval, as agent.go's
// receive reads it.
func testHeartbeat() *v1.AgentMessage {
	return &v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
		Phase: v1.AgentPhase_AGENT_PHASE_READY, UptimeSeconds: 86400, AgentVersion: "v0.9.0",
		RunningModuleDigests: []string{"sha256:" + strings.Repeat("a", 64), "sha256:" + strings.Repeat("b", 64),
			"sha256:" + strings.Repeat("c", 64), "sha256:" + strings.Repeat("d", 64)},
		Addresses: []string{"10.0.2.15/24", "fe80::5054:ff:fe12:3456/64", "192.168.122.7/24"},
		BootId:    "5b0e6c1e-4c1f-4f5e-9d6a-2f1c3b7a8e90",
	}}}
}

func BenchmarkCheckStrictHeartbeat(b *testing.B) {
	m := testHeartbeat()
	b.ReportAllocs()
	for b.Loop() {
		if err := checkStrict(m); err != nil {
			b.Fatal(err)
		}
	}
}
