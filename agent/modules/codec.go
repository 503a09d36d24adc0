package modules

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// chunkCodec is gRPC's proto codec with one shortcut, used only on
// FetchModule calls (grpc.ForceCodecV2): a response received into a
// *wireChunk keeps its data in the transport's receive buffers. The proto
// codec would copy every byte twice, into one contiguous buffer and then
// into a new slice, and make 64 MiB of garbage per 64 MiB module. The name
// is "proto", so the wire and the server are unchanged.
type chunkCodec struct{}

var protoCodec = encoding.GetCodecV2(grpcproto.Name)

func (chunkCodec) Name() string { return grpcproto.Name }

func (chunkCodec) Marshal(v any) (mem.BufferSlice, error) { return protoCodec.Marshal(v) }

func (chunkCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if c, ok := v.(*wireChunk); ok {
		return c.decode(data)
	}
	return protoCodec.Unmarshal(data, v)
}

// wireChunk is a tether.v1.ModuleChunk whose data are references to gRPC's
// receive buffers; whoever holds it must call free.
type wireChunk struct {
	offset int64
	size   int64
	data   mem.BufferSlice
}

// ModuleChunk field numbers (proto/tether/v1).
const (
	chunkOffsetField protowire.Number = 1
	chunkDataField   protowire.Number = 2
	chunkSizeField   protowire.Number = 3
)

func (c *wireChunk) free() {
	c.data.Free()
	c.data = nil
}

// decode parses the ModuleChunk wire format straight from the buffers gRPC
// received it in, taking a reference to the data bytes instead of copying
// them. Unknown fields are skipped, as proto.Unmarshal would.
func (c *wireChunk) decode(bufs mem.BufferSlice) (err error) {
	c.free()
	*c = wireChunk{}
	defer func() {
		if err != nil {
			c.free()
		}
	}()
	r := bufReader{bufs: bufs}
	for !r.done() {
		tag, err := r.varint()
		if err != nil {
			return err
		}
		num, typ := protowire.DecodeTag(tag)
		switch {
		case num == chunkOffsetField && typ == protowire.VarintType:
			v, err := r.varint()
			if err != nil {
				return err
			}
			c.offset = int64(v)
		case num == chunkSizeField && typ == protowire.VarintType:
			v, err := r.varint()
			if err != nil {
				return err
			}
			c.size = int64(v)
		case num == chunkDataField && typ == protowire.BytesType:
			n, err := r.length()
			if err != nil {
				return err
			}
			c.data.Free() // the last occurrence wins, as in proto
			if c.data, err = r.take(n); err != nil {
				return err
			}
		case num == chunkOffsetField || num == chunkDataField || num == chunkSizeField:
			return fmt.Errorf("ModuleChunk field %d has wire type %d", num, typ)
		default:
			if err := r.skip(typ); err != nil {
				return fmt.Errorf("ModuleChunk field %d: %w", num, err)
			}
		}
	}
	return nil
}

var errTruncated = errors.New("ModuleChunk is truncated")

// bufReader reads protobuf wire data spread over several buffers (one per
// HTTP/2 DATA frame); a varint may straddle two of them.
type bufReader struct {
	bufs mem.BufferSlice
	i    int // current buffer
	off  int // position in bufs[i]
}

func (r *bufReader) done() bool {
	for r.i < len(r.bufs) && r.off == r.bufs[r.i].Len() {
		r.i, r.off = r.i+1, 0
	}
	return r.i == len(r.bufs)
}

func (r *bufReader) byte() (byte, error) {
	if r.done() {
		return 0, errTruncated
	}
	b := r.bufs[r.i].ReadOnlyData()[r.off]
	r.off++
	return b, nil
}

func (r *bufReader) varint() (uint64, error) {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		b, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v, nil
		}
	}
	return 0, errors.New("ModuleChunk holds an overlong varint")
}

// length reads a length prefix and checks that many bytes remain.
func (r *bufReader) length() (int, error) {
	v, err := r.varint()
	if err != nil {
		return 0, err
	}
	remaining := -r.off
	for _, b := range r.bufs[r.i:] {
		remaining += b.Len()
	}
	if v > uint64(remaining) {
		return 0, errTruncated
	}
	return int(v), nil
}

// take returns the next n bytes as views that hold references of their own.
func (r *bufReader) take(n int) (mem.BufferSlice, error) {
	var out mem.BufferSlice
	for n > 0 {
		if r.done() {
			out.Free()
			return nil, errTruncated
		}
		b := r.bufs[r.i]
		k := min(n, b.Len()-r.off)
		out = append(out, b.Slice(r.off, r.off+k))
		r.off += k
		n -= k
	}
	return out, nil
}

func (r *bufReader) skip(typ protowire.Type) error {
	var n int
	switch typ {
	case protowire.VarintType:
		_, err := r.varint()
		return err
	case protowire.Fixed32Type:
		n = 4
	case protowire.Fixed64Type:
		n = 8
	case protowire.BytesType:
		var err error
		if n, err = r.length(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unsupported wire type %d", typ)
	}
	for n > 0 {
		if r.done() {
			return errTruncated
		}
		k := min(n, r.bufs[r.i].Len()-r.off)
		r.off += k
		n -= k
	}
	return nil
}
