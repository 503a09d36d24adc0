package modules

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// countingPool hands out buffers (big enough for gRPC to pool them) and
// counts those that come back.
type countingPool struct{ gets, puts atomic.Int64 }

func (p *countingPool) Get(n int) *[]byte {
	p.gets.Add(1)
	b := make([]byte, n, max(n, 4096))
	return &b
}

func (p *countingPool) Put(*[]byte) { p.puts.Add(1) }

// outstanding is how many buffers have not come back.
func (p *countingPool) outstanding() int64 { return p.gets.Load() - p.puts.Load() }

// split cuts b into pooled buffers at the given positions, as HTTP/2 DATA
// frames would.
func split(p *countingPool, b []byte, cuts ...int) mem.BufferSlice {
	var out mem.BufferSlice
	prev := 0
	for _, c := range append(cuts, len(b)) {
		buf := p.Get(c - prev)
		copy(*buf, b[prev:c])
		out = append(out, mem.NewBuffer(buf, p))
		prev = c
	}
	return out
}

func marshal(t *testing.T, c *tetherv1.ModuleChunk) []byte {
	t.Helper()
	b, err := proto.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestChunkCodecDecodesAcrossBuffers(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 40)
	want := &tetherv1.ModuleChunk{Offset: 1 << 40, Data: data, Size: 300 << 20}
	wire := marshal(t, want)
	// Every cut position, so that each varint and the length prefix
	// straddle two buffers at some point.
	for cut := 0; cut <= len(wire); cut++ {
		p := &countingPool{}
		in := split(p, wire, cut, min(cut+7, len(wire)))
		var c wireChunk
		if err := (chunkCodec{}).Unmarshal(in, &c); err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		in.Free() // as gRPC does once Unmarshal returns
		if c.offset != want.Offset || c.size != want.Size || !bytes.Equal(c.data.Materialize(), data) {
			t.Fatalf("cut at %d: got offset %d size %d, %d data bytes", cut, c.offset, c.size, c.data.Len())
		}
		if p.outstanding() == 0 {
			t.Fatalf("cut at %d: the data was copied out of the receive buffers", cut)
		}
		c.free()
		if n := p.outstanding(); n != 0 {
			t.Fatalf("cut at %d: %d buffers not returned", cut, n)
		}
	}
}

func TestChunkCodecSkipsUnknownFields(t *testing.T) {
	wire := marshal(t, &tetherv1.ModuleChunk{Offset: 5, Data: []byte("data"), Size: 9})
	wire = protowire.AppendTag(wire, 10, protowire.VarintType)
	wire = protowire.AppendVarint(wire, 1<<50)
	wire = protowire.AppendTag(wire, 11, protowire.BytesType)
	wire = protowire.AppendBytes(wire, []byte("a later field"))
	wire = protowire.AppendTag(wire, 12, protowire.Fixed32Type)
	wire = protowire.AppendFixed32(wire, 7)
	wire = protowire.AppendTag(wire, 13, protowire.Fixed64Type)
	wire = protowire.AppendFixed64(wire, 7)
	// A repeated field keeps the last value, as proto does.
	wire = protowire.AppendTag(wire, 2, protowire.BytesType)
	wire = protowire.AppendBytes(wire, []byte("last"))
	p := &countingPool{}
	in := split(p, wire, 3, 9)
	var c wireChunk
	if err := (chunkCodec{}).Unmarshal(in, &c); err != nil {
		t.Fatal(err)
	}
	in.Free()
	if c.offset != 5 || c.size != 9 || string(c.data.Materialize()) != "last" {
		t.Fatalf("got offset %d size %d data %q", c.offset, c.size, c.data.Materialize())
	}
	c.free()
	if n := p.outstanding(); n != 0 {
		t.Fatalf("%d buffers not returned", n)
	}
}

func TestChunkCodecRefusesMalformed(t *testing.T) {
	good := marshal(t, &tetherv1.ModuleChunk{Offset: 1, Data: bytes.Repeat([]byte("x"), 100), Size: 2})
	wrongType := protowire.AppendTag(nil, 2, protowire.VarintType)
	wrongType = protowire.AppendVarint(wrongType, 1)
	group := protowire.AppendTag(nil, 20, protowire.StartGroupType)
	for _, tc := range []struct {
		name, want string
		wire       []byte
	}{
		{"truncated data", "truncated", good[:len(good)-5]},
		{"truncated varint", "truncated", []byte{0x08, 0x80}},
		{"overlong varint", "overlong", append([]byte{0x08}, bytes.Repeat([]byte{0x80}, 11)...)},
		{"data as a varint", "wire type", wrongType},
		{"group", "wire type", group},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &countingPool{}
			in := split(p, tc.wire, len(tc.wire)/2)
			var c wireChunk
			err := (chunkCodec{}).Unmarshal(in, &c)
			in.Free()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if n := p.outstanding(); c.data != nil || n != 0 {
				t.Fatalf("a refused chunk holds %d buffers", n)
			}
		})
	}
}

func TestChunkCodecLeavesOtherMessagesToProto(t *testing.T) {
	req := &tetherv1.FetchModuleRequest{Digest: "sha256:x", Offset: 3}
	b, err := (chunkCodec{}).Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back tetherv1.FetchModuleRequest
	if err := (chunkCodec{}).Unmarshal(b, &back); err != nil || !proto.Equal(req, &back) {
		t.Fatalf("round trip: %v %v", &back, err)
	}
	if (chunkCodec{}).Name() != "proto" {
		t.Fatal("the codec must look like proto on the wire")
	}
}
