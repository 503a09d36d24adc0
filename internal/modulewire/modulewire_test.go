package modulewire

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// countingPool records what comes back.
type countingPool struct{ puts int }

func (p *countingPool) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (p *countingPool) Put(*[]byte)       { p.puts++ }

func TestChunkEncodesAsModuleChunk(t *testing.T) {
	c := NewCodec(encoding.GetCodecV2("proto"))
	data := bytes.Repeat([]byte("erofs"), 60000)
	for _, tc := range []struct {
		name         string
		offset, size int64
		data         []byte
	}{
		{"first", 0, 1 << 30, data},
		{"middle", 262144, 0, data},
		{"empty module", 0, 0, nil},
		{"empty first chunk", 0, 5, nil},
		{"small", 7, 0, []byte("x")},
		{"negative", -1, -2, data[:10]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := proto.Marshal(&tetherv1.ModuleChunk{Offset: tc.offset, Data: tc.data, Size: tc.size})
			if err != nil {
				t.Fatal(err)
			}
			pool := &countingPool{}
			buf := append(make([]byte, 0, 4096), tc.data...)
			got, err := c.Marshal(&Chunk{Offset: tc.offset, Size: tc.size, Data: mem.NewBuffer(&buf, pool)})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Materialize(), want) {
				t.Fatalf("encoding differs from proto.Marshal:\n got %x\nwant %x", got.Materialize()[:20], want[:min(20, len(want))])
			}
			var back tetherv1.ModuleChunk
			if err := c.Unmarshal(got, &back); err != nil || back.Offset != tc.offset || back.Size != tc.size || !bytes.Equal(back.Data, tc.data) {
				t.Fatalf("round trip: %v %v", &back, err)
			}
			// The data buffer was handed over, not copied: freeing the
			// encoded message (as gRPC does once it is written) returns it.
			got.Free()
			if pool.puts != 1 {
				t.Fatalf("data buffer returned %d times, want once", pool.puts)
			}
		})
	}
}

func TestOtherMessagesUseTheWrappedCodec(t *testing.T) {
	c := NewCodec(encoding.GetCodecV2("proto"))
	if c.Name() != "proto" {
		t.Fatalf("name %q", c.Name())
	}
	in := &tetherv1.ModuleChunk{Offset: 3, Data: []byte("abc"), Size: 9}
	b, err := c.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out tetherv1.ModuleChunk
	if err := c.Unmarshal(b, &out); err != nil || !proto.Equal(in, &out) {
		t.Fatalf("round trip: %v %v", &out, err)
	}
	if _, err := c.Marshal("not a message"); err == nil {
		t.Fatal("the wrapped codec's errors are lost")
	}
}

func TestBuffersReuseWithoutClearing(t *testing.T) {
	b := Buffers.Get(256 << 10)
	if len(*b) != 256<<10 {
		t.Fatalf("len %d", len(*b))
	}
	Buffers.Put(b)
	b = Buffers.Get(1000)
	if len(*b) != 1000 {
		t.Fatalf("len %d after reuse", len(*b))
	}
}
