package api

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// unparsedField is the field number badWireCodec marks an unparseable
// request with: the largest a field may have, which no Tether message uses.
const unparsedField protowire.Number = protowire.MaxValidNumber

// badWireCodec turns a request that does not parse (invalid UTF-8 in a
// string field, a truncated field) into bad input. gRPC answers an error
// from the codec with Internal, before any interceptor runs, and Internal
// means a bug in tetherd (ARCHITECTURE's code table): here the bug is the
// client's. So the codec answers with an empty message that carries the
// parse error as one unknown field, and the strict check, which refuses
// unknown fields, refuses it with InvalidArgument naming the message.
type badWireCodec struct{ encoding.CodecV2 }

func (c badWireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	m, ok := v.(proto.Message)
	if err == nil || !ok {
		return err
	}
	proto.Reset(m)
	raw := protowire.AppendTag(nil, unparsedField, protowire.BytesType)
	raw = protowire.AppendString(raw, err.Error())
	m.ProtoReflect().SetUnknown(raw)
	return nil
}

// unparsed returns the parse error badWireCodec recorded in raw, if any.
func unparsed(raw []byte) (string, bool) {
	num, typ, n := protowire.ConsumeTag(raw)
	if n < 0 || num != unparsedField || typ != protowire.BytesType {
		return "", false
	}
	v, m := protowire.ConsumeString(raw[n:])
	if m < 0 {
		return "", false
	}
	return v, true
}
