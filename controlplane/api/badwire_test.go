package api_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
)

// rawCodec sends []byte as they are: a client that does not check what
// it sends, as an attacker's.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (rawCodec) Name() string { return "proto" }

// A request that does not parse, invalid UTF-8 in a string field or a
// truncated one, is bad input: InvalidArgument naming the message, never
// Internal (a bug in tetherd).
func TestUnparseableRequestsAreInvalidArgument(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	badToken := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "tok\xff\xfe")
	truncated := protowire.AppendTag(nil, 2, protowire.BytesType) // a length that never comes
	enroll := cp.Dial(nil)
	for name, body := range map[string][]byte{"invalid UTF-8": badToken, "truncated": truncated} {
		t.Run(name, func(t *testing.T) {
			var out []byte
			err := enroll.Invoke(ctx, "/tether.v1.EnrollmentService/Enroll", &body, &out, grpc.ForceCodecV2(rawCodec{}))
			wantMsg(t, err, codes.InvalidArgument, "EnrollRequest", "does not parse")
		})
	}

	// A heartbeat on an agent's stream, with invalid UTF-8 in its version.
	_, cert := enrolled(t, cp, fleet.Node)
	conn := cp.Dial(&cert)
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{StreamName: "Connect", ClientStreams: true, ServerStreams: true},
		"/tether.v1.AgentService/Connect", grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	hb := protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType), "v1\xc0")
	msg := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), hb)
	if err := st.SendMsg(&msg); err != nil {
		t.Fatal(err)
	}
	for {
		var out []byte
		if err = st.RecvMsg(&out); err != nil {
			break // settings may come first
		}
	}
	wantMsg(t, err, codes.InvalidArgument, "AgentMessage", "does not parse")
}
