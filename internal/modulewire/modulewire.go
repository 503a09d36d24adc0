// Package modulewire lets a FetchModule server send tether.v1.ModuleChunk
// messages without copying their data: the proto codec copies every chunk
// into a fresh (cleared) buffer before gRPC frames it, which is a memclr and
// a memmove of every module byte served. The bytes on the wire are the
// ones proto.Marshal produces, so clients see an ordinary ModuleChunk.
package modulewire

import (
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// Chunk is a ModuleChunk to send with stream.SendMsg through Codec. Data
// is handed over with the message: gRPC releases it once it is on the wire
// (or the send fails), so the sender must not touch it after SendMsg.
type Chunk struct {
	Offset int64
	Data   mem.Buffer
	Size   int64
}

// ModuleChunk field numbers (proto/tether/v1).
const (
	offsetField protowire.Number = 1
	dataField   protowire.Number = 2
	sizeField   protowire.Number = 3
)

// Codec is a gRPC codec that encodes *Chunk itself and leaves every other
// message to the codec it wraps, so it can stand in for the proto codec.
type Codec struct{ encoding.CodecV2 }

// NewCodec wraps base (the proto codec).
func NewCodec(base encoding.CodecV2) Codec { return Codec{base} }

// Marshal implements encoding.CodecV2.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	ch, ok := v.(*Chunk)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	if ch.Data == nil {
		ch.Data = mem.SliceBuffer(nil)
	}
	// Fields in number order, zero values omitted, as proto.Marshal does.
	var head, tail []byte
	if ch.Offset != 0 {
		head = protowire.AppendTag(head, offsetField, protowire.VarintType)
		head = protowire.AppendVarint(head, uint64(ch.Offset))
	}
	if n := ch.Data.Len(); n > 0 {
		head = protowire.AppendTag(head, dataField, protowire.BytesType)
		head = protowire.AppendVarint(head, uint64(n))
	}
	if ch.Size != 0 {
		tail = protowire.AppendTag(tail, sizeField, protowire.VarintType)
		tail = protowire.AppendVarint(tail, uint64(ch.Size))
	}
	return mem.BufferSlice{mem.SliceBuffer(head), ch.Data, mem.SliceBuffer(tail)}, nil
}

// Buffers recycles chunk buffers. Unlike gRPC's default pool it does not
// clear them on reuse: a sender fills every byte it sends (ReadAt), and
// clearing 256 KiB per chunk would cost as much as the copy Codec saves.
var Buffers mem.BufferPool = &pool{}

type pool struct{ p sync.Pool }

func (p *pool) Get(size int) *[]byte {
	if b, ok := p.p.Get().(*[]byte); ok && cap(*b) >= size {
		*b = (*b)[:size]
		return b
	}
	b := make([]byte, size)
	return &b
}

func (p *pool) Put(b *[]byte) { p.p.Put(b) }
