package measuredboot

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	gattest "github.com/google/go-attestation/attest"

	"github.com/tetherfleet/tether/pki/attestation"
)

// ubuntuLog is a GCE shielded VM's event log with Secure Boot off, from
// go-attestation's test data (Apache 2.0).
const ubuntuLog = "testdata/ubuntu_2104_shielded_vm_no_secure_boot_eventlog"

// pcrsOf replays the log's SHA-256 digests into the PCR values a TPM
// would hold, so that the log verifies against them.
func pcrsOf(t *testing.T, log []byte) []attestation.PCR {
	t.Helper()
	el, err := gattest.ParseEventLog(log)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[int][]byte{}
	for _, e := range el.Events(gattest.HashSHA256) {
		if e.Type == 3 { // EV_NO_ACTION is not extended
			continue
		}
		cur, ok := vals[e.Index]
		if !ok {
			cur = make([]byte, 32)
		}
		h := sha256.Sum256(append(append([]byte{}, cur...), e.Digest...))
		vals[e.Index] = h[:]
	}
	var out []attestation.PCR
	for i := range 24 {
		v, ok := vals[i]
		if !ok {
			v = make([]byte, 32)
		}
		out = append(out, attestation.PCR{Index: i, Digest: v})
	}
	return out
}

func TestVerify(t *testing.T) {
	log, err := os.ReadFile(ubuntuLog)
	if err != nil {
		t.Fatal(err)
	}
	pcrs := pcrsOf(t, log)
	// What the log's firmware ran: shim, then GRUB, then the kernel.
	booted, _ := Verify(Image{Template: "t", PEHash: make([]byte, 32)}, log, pcrs)
	if len(booted.Applications) == 0 {
		t.Fatal("no boot application read from PCR 4")
	}
	first, _ := hex.DecodeString(booted.Applications[0])
	tampered := append([]attestation.PCR(nil), pcrs...)
	tampered[4] = attestation.PCR{Index: 4, Digest: make([]byte, 32)}

	tests := []struct {
		name string
		img  Image
		log  []byte
		pcrs []attestation.PCR
		want string
	}{
		{"another image", Image{Template: "t", Digest: "sha256:aa", PEHash: make([]byte, 32)}, log, pcrs, "but the node's firmware ran EFI applications " + booted.Applications[0]},
		{"its image, Secure Boot off", Image{Template: "t", Digest: "sha256:aa", PEHash: first}, log, pcrs, "with Secure Boot off"},
		{"no event log", Image{Template: "t", PEHash: first}, nil, pcrs, "sent no firmware event log"},
		{"PCR 4 does not match the log", Image{Template: "t", PEHash: first}, log, tampered, "does not replay"},
		{"garbage log", Image{Template: "t", PEHash: first}, []byte("not a log"), pcrs, "does not parse"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Verify(tc.img, tc.log, tc.pcrs)
			if !IsRefusal(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want a refusal saying %q", err, tc.want)
			}
		})
	}
}
