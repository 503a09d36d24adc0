package tftp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Opcodes (RFC 1350, RFC 2347).
const (
	opRRQ   = 1
	opWRQ   = 2
	opDATA  = 3
	opACK   = 4
	opERROR = 5
	opOACK  = 6
)

// Error codes (RFC 1350).
const (
	errUndefined       = 0
	errFileNotFound    = 1
	errAccessViolation = 2
)

// Block sizes (RFC 2348 allows 8 to 65464). The largest this server
// agrees to is what fits one Ethernet frame unfragmented (1500 - 20 IP -
// 8 UDP - 4 TFTP): a larger block is sent as IP fragments, and a 65 KB one
// is a reflector's answer to a 40-byte request. iPXE asks for 1432.
const (
	DefaultBlockSize = 512
	MinBlockSize     = 8
	MaxBlockSize     = 1468
)

// maxRequest bounds a request datagram: a name, a mode and a few options
// fit in far less, and anything longer is not a PXE client.
const maxRequest = 512

// Request is a parsed read or write request.
type Request struct {
	Write bool
	Name  string
	Mode  string
	// Options are the RFC 2347 options, names lower-cased, in the order
	// sent; a repeated option keeps its first value.
	Options map[string]string
	order   []string
}

// ErrMalformed is the refusal of a datagram that is not a well-formed
// request.
var ErrMalformed = errors.New("malformed TFTP request")

// ParseRequest parses an RRQ or WRQ datagram. It reads no byte it has not
// checked is there: a 2-byte "00 01" is an error, not a panic (the
// library this replaced sliced past its end, issue 26).
func ParseRequest(b []byte) (Request, error) {
	if len(b) < 2 {
		return Request{}, fmt.Errorf("%w: %d bytes, no opcode", ErrMalformed, len(b))
	}
	if len(b) > maxRequest {
		return Request{}, fmt.Errorf("%w: %d bytes, over %d", ErrMalformed, len(b), maxRequest)
	}
	op := binary.BigEndian.Uint16(b)
	if op != opRRQ && op != opWRQ {
		return Request{}, fmt.Errorf("%w: opcode %d is not a request", ErrMalformed, op)
	}
	rest := b[2:]
	if len(rest) == 0 || rest[len(rest)-1] != 0 {
		return Request{}, fmt.Errorf("%w: fields not NUL-terminated", ErrMalformed)
	}
	fields := strings.Split(string(rest[:len(rest)-1]), "\x00")
	if len(fields) < 2 || len(fields)%2 != 0 {
		return Request{}, fmt.Errorf("%w: want name, mode and option pairs, got %d fields", ErrMalformed, len(fields))
	}
	r := Request{Write: op == opWRQ, Name: fields[0], Mode: strings.ToLower(fields[1]), Options: map[string]string{}}
	if r.Name == "" {
		return Request{}, fmt.Errorf("%w: empty file name", ErrMalformed)
	}
	if r.Mode != "octet" && r.Mode != "netascii" {
		return Request{}, fmt.Errorf("%w: mode %q (want octet)", ErrMalformed, clip(r.Mode))
	}
	for i := 2; i < len(fields); i += 2 {
		name := strings.ToLower(fields[i])
		if name == "" {
			return Request{}, fmt.Errorf("%w: empty option name", ErrMalformed)
		}
		if _, dup := r.Options[name]; dup {
			continue
		}
		r.Options[name] = fields[i+1]
		r.order = append(r.order, name)
	}
	return r, nil
}

// negotiated is what the server agrees to of a request's options.
type negotiated struct {
	blockSize int
	// oack holds the accepted options in the order asked (empty: none
	// accepted, the transfer starts with block 1 at 512 bytes).
	oack []string
}

// negotiate answers blksize (clamped to MaxBlockSize; below RFC 2348's
// minimum of 8 or not a number, ignored, so the transfer uses 512) and
// tsize (the file's size); every other option is left out of the OACK,
// which RFC 2347 reads as refused.
func (r Request) negotiate(size int64) negotiated {
	n := negotiated{blockSize: DefaultBlockSize}
	for _, name := range r.order {
		v := r.Options[name]
		switch name {
		case "blksize":
			bs, err := strconv.Atoi(v)
			if err != nil || bs < MinBlockSize || bs > 65464 {
				continue
			}
			n.blockSize = min(bs, MaxBlockSize)
			n.oack = append(n.oack, name, strconv.Itoa(n.blockSize))
		case "tsize":
			if v != "0" || size < 0 {
				continue
			}
			n.oack = append(n.oack, name, strconv.FormatInt(size, 10))
		}
	}
	return n
}

func packetOACK(opts []string) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, opOACK})
	for _, o := range opts {
		b.WriteString(o)
		b.WriteByte(0)
	}
	return b.Bytes()
}

func packetError(code uint16, msg string) []byte {
	b := make([]byte, 4, 5+len(msg))
	binary.BigEndian.PutUint16(b, opERROR)
	binary.BigEndian.PutUint16(b[2:], code)
	b = append(b, msg...)
	return append(b, 0)
}

// ackOf parses an ACK or ERROR from a peer in a transfer: ok false for
// anything else (dropped: a stray datagram must not end the transfer).
func ackOf(b []byte) (block uint16, isErr, ok bool) {
	if len(b) < 4 {
		return 0, false, false
	}
	switch binary.BigEndian.Uint16(b) {
	case opACK:
		return binary.BigEndian.Uint16(b[2:]), false, true
	case opERROR:
		return 0, true, true
	}
	return 0, false, false
}
