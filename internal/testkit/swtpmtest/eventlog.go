package swtpmtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// Event is one measurement a test's firmware makes.
type Event struct {
	PCR  int
	Type uint32
	Data []byte
}

// EvIPL is EV_IPL, what a boot loader logs for what it loads.
const EvIPL = 0x0000000d

// Measure extends each event's SHA-256 into its PCR through rwc, as a
// firmware does, and returns the TCG crypto-agile event log that records
// them: a log that replays to the PCRs.
func Measure(rwc io.ReadWriter, events []Event) ([]byte, error) {
	for _, e := range events {
		sum := sha256.Sum256(e.Data)
		if err := tpm2.PCRExtend(rwc, tpmutilHandle(e.PCR), tpm2.AlgSHA256, sum[:], ""); err != nil {
			return nil, fmt.Errorf("extend PCR %d: %w", e.PCR, err)
		}
	}
	return EventLog(events), nil
}

// EventLog is the TCG PC Client crypto-agile log of events, SHA-256 only:
// the Spec ID header in the SHA-1 format, then one TCG_PCR_EVENT2 each.
func EventLog(events []Event) []byte {
	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }

	var spec bytes.Buffer
	spec.WriteString("Spec ID Event03\x00")
	specLE := func(v any) { _ = binary.Write(&spec, binary.LittleEndian, v) }
	specLE(uint32(0)) // platform class
	specLE(uint8(0))  // spec version minor
	specLE(uint8(2))  // major
	specLE(uint8(0))  // errata
	specLE(uint8(2))  // uintn size
	specLE(uint32(1)) // algorithms
	specLE(uint16(tpm2.AlgSHA256))
	specLE(uint16(sha256.Size))
	specLE(uint8(0)) // vendor info

	le(uint32(0)) // PCR
	le(uint32(3)) // EV_NO_ACTION
	b.Write(make([]byte, 20))
	le(uint32(spec.Len()))
	b.Write(spec.Bytes())

	for _, e := range events {
		sum := sha256.Sum256(e.Data)
		le(uint32(e.PCR))
		le(e.Type)
		le(uint32(1))
		le(uint16(tpm2.AlgSHA256))
		b.Write(sum[:])
		le(uint32(len(e.Data)))
		b.Write(e.Data)
	}
	return b.Bytes()
}

func tpmutilHandle(pcr int) tpmutil.Handle { return tpmutil.Handle(pcr) }
