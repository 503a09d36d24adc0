package dhcp

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// ukiChooser answers BootsUKI from a map, or with err.
type ukiChooser struct {
	boots map[string]bool
	err   error
	asked []string
}

func (c *ukiChooser) BootsUKI(_ context.Context, mac string) (bool, error) {
	c.asked = append(c.asked, mac)
	return c.boots[mac], c.err
}

// UEFI HTTP Boot of a machine whose template boots a signed image gets the
// image's URL bound to its address; other machines, and other clients of
// that machine, get what they got before.
func TestUKIBootFile(t *testing.T) {
	ipxe := dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE"))
	httpBoot := pxe(iana.EFI_X86_64_HTTP, "HTTPClient:Arch:00016:UNDI:003016")
	tests := []struct {
		name  string
		mode  Mode
		boots bool
		mods  []dhcpv4.Modifier
		file  string
		class string
	}{
		{"HTTP Boot, UKI, proxy", Proxy, true, httpBoot, http0 + "/uki/boot?mac=52:54:00:12:34:56", "HTTPClient"},
		{"HTTP Boot, UKI, full", Full, true, httpBoot, http0 + "/uki/boot?mac=52:54:00:12:34:56", "HTTPClient"},
		{"HTTP Boot, no UKI", Proxy, false, httpBoot, http0 + "/loaders/ipxe.efi", "HTTPClient"},
		{"HTTP Boot by class alone", Proxy, true, pxe(iana.EFI_X86_64, "HTTPClient:Arch:00016"), http0 + "/uki/boot?mac=52:54:00:12:34:56", "HTTPClient"},
		// iPXE asks the boot route, which chains to the UKI itself.
		{"iPXE, UKI", Proxy, true, pxe(iana.EFI_X86_64, "PXEClient:Arch:00007:UNDI:003016", ipxe), http0 + "/ipxe/boot?mac=52:54:00:12:34:56", "PXEClient"},
		// PXE firmware fetches by TFTP, which cannot carry a UKI URL: the loader.
		{"UEFI PXE, UKI", Proxy, true, pxe(iana.EFI_X86_64, "PXEClient:Arch:00007:UNDI:003016"), "ipxe.efi", "PXEClient"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHandler(t, tc.mode)
			h.UKI = &ukiChooser{boots: map[string]bool{"52:54:00:12:34:56": tc.boots}}
			r, err := h.Respond(context.Background(), discover(t, tc.mods...))
			if err != nil {
				t.Fatal(err)
			}
			if r.BootFileName != tc.file || r.ClassIdentifier() != tc.class {
				t.Fatalf("boot file %q class %q, want %q %q", r.BootFileName, r.ClassIdentifier(), tc.file, tc.class)
			}
		})
	}
}

// A lookup that fails gets no reply, never the loader in the image's place.
func TestUKIBootFileLookupFails(t *testing.T) {
	h := newHandler(t, Proxy)
	c := &ukiChooser{err: errors.New("store down")}
	h.UKI = c
	r, err := h.Respond(context.Background(), discover(t, pxe(iana.EFI_X86_64_HTTP, "HTTPClient:Arch:00016:UNDI:003016")...))
	var ig *Ignored
	if r != nil || err == nil || errors.As(err, &ig) || !strings.Contains(err.Error(), "store down") {
		t.Fatalf("reply %v, err %v: want no reply and the store's error", r, err)
	}
	if len(c.asked) != 1 || c.asked[0] != "52:54:00:12:34:56" {
		t.Fatalf("asked %v", c.asked)
	}
}
