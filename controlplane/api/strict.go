package api

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tetherfleet/tether/controlplane/fail"
)

// checkStrict refuses a message carrying fields or enum values this server
// does not know (docs/design.md §0.2): silently dropping them would let a call
// "succeed" having done nothing it was asked.
func checkStrict(m proto.Message) error {
	if m == nil {
		return nil
	}
	return walk(m.ProtoReflect(), string(m.ProtoReflect().Descriptor().Name()))
}

func walk(m protoreflect.Message, path string) error {
	if raw := m.GetUnknown(); len(raw) > 0 {
		num, _, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return fail.Invalid(path, "malformed unknown field data")
		}
		return fail.Invalid(path, "unknown field number %d (this server does not know it; check the client and server versions)", num)
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := path + "." + string(fd.Name())
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = checkValue(fd, l.Get(i), fmt.Sprintf("%s[%d]", name, i))
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				err = checkValue(fd.MapValue(), mv, fmt.Sprintf("%s[%v]", name, k.Interface()))
				return err == nil
			})
		default:
			err = checkValue(fd, v, name)
		}
		return err == nil
	})
	return err
}

func checkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value, path string) error {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		// google.protobuf.Struct and friends carry free-form keys and values,
		// which walk never refuses; but an unknown field number inside one is
		// dropped by the decoder like anywhere else, so they are walked too
		// (the fuzzer found a CreateNodeRequest.config carrying one).
		return walk(v.Message(), path)
	case protoreflect.EnumKind:
		if fd.Enum().Values().ByNumber(v.Enum()) == nil {
			return fail.Invalid(path, "unknown %s value %d", fd.Enum().Name(), v.Enum())
		}
	}
	return nil
}

func strictUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if m, ok := req.(proto.Message); ok {
		if err := checkStrict(m); err != nil {
			return nil, err
		}
	}
	return next(ctx, req)
}

func strictStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	return next(srv, &strictServerStream{ServerStream: ss})
}

type strictServerStream struct{ grpc.ServerStream }

func (s *strictServerStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if pm, ok := m.(proto.Message); ok {
		return checkStrict(pm)
	}
	return nil
}
