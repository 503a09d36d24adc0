package api

import (
	"context"
	"fmt"
	"strconv"
	"strings"

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
	r := m.ProtoReflect()
	se := walk(r)
	if se == nil {
		return nil
	}
	var path strings.Builder
	path.WriteString(string(r.Descriptor().Name()))
	for i := len(se.rev) - 1; i >= 0; i-- {
		path.WriteString(se.rev[i])
	}
	return fail.Invalid(path.String(), "%s", se.msg)
}

// refusal is why walk refused a message, with the path to the offending
// field gathered as walk unwinds: every message received is walked
// (heartbeats included) and almost none is refused, so building each
// field's path on the way in was wasted work.
type refusal struct {
	rev []string // path elements, innermost first
	msg string
}

func (r *refusal) at(elem string) { r.rev = append(r.rev, elem) }

func walk(m protoreflect.Message) *refusal {
	if raw := m.GetUnknown(); len(raw) > 0 {
		if why, ok := unparsed(raw); ok {
			return &refusal{msg: "the message does not parse: " + why}
		}
		num, _, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return &refusal{msg: "malformed unknown field data"}
		}
		return &refusal{msg: fmt.Sprintf("unknown field number %d (this server does not know it; check the client and server versions)", num)}
	}
	md := m.Descriptor()
	if md.ExtensionRanges().Len() > 0 {
		// Only Range visits extension fields.
		var se *refusal
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			se = checkField(fd, v)
			return se == nil
		})
		return se
	}
	// Only message and enum fields can be refused, so walk reads those
	// alone rather than ranging over every set field: a heartbeat's
	// strings and counters were most of the walk's cost.
	// A oneof is asked which member it holds, once, not each member
	// whether it is set (an agent's every message is one).
	oneofs := md.Oneofs()
	for i := 0; i < oneofs.Len(); i++ {
		if fd := m.WhichOneof(oneofs.Get(i)); fd != nil && mayRefuse(fd) {
			if se := checkField(fd, m.Get(fd)); se != nil {
				return se
			}
		}
	}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.ContainingOneof() != nil || !mayRefuse(fd) || !m.Has(fd) {
			continue
		}
		if se := checkField(fd, m.Get(fd)); se != nil {
			return se
		}
	}
	return nil
}

// checkField checks one set field's value, naming the field in a refusal.
func checkField(fd protoreflect.FieldDescriptor, v protoreflect.Value) *refusal {
	var se *refusal
	switch {
	case fd.IsList():
		if !mayRefuse(fd) {
			return nil
		}
		l := v.List()
		for i := 0; i < l.Len(); i++ {
			if se = checkValue(fd, l.Get(i)); se != nil {
				se.at("[" + strconv.Itoa(i) + "]")
				break
			}
		}
	case fd.IsMap():
		if !mayRefuse(fd.MapValue()) {
			return nil
		}
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			if se = checkValue(fd.MapValue(), mv); se != nil {
				se.at(fmt.Sprintf("[%v]", k.Interface()))
			}
			return se == nil
		})
	default:
		se = checkValue(fd, v)
	}
	if se != nil {
		se.at("." + string(fd.Name()))
	}
	return se
}

// mayRefuse reports whether a value of fd can be refused: only messages
// (walked) and enums (checked) can, so lists and maps of anything else are
// not iterated.
func mayRefuse(fd protoreflect.FieldDescriptor) bool {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind, protoreflect.EnumKind:
		return true
	}
	return false
}

func checkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) *refusal {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		// google.protobuf.Struct and friends carry free-form keys and values,
		// which walk never refuses; but an unknown field number inside one is
		// dropped by the decoder like anywhere else, so they are walked too
		// (the fuzzer found a CreateNodeRequest.config carrying one).
		return walk(v.Message())
	case protoreflect.EnumKind:
		if fd.Enum().Values().ByNumber(v.Enum()) == nil {
			return &refusal{msg: fmt.Sprintf("unknown %s value %d", fd.Enum().Name(), v.Enum())}
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
