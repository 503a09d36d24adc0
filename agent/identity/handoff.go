package identity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// CheckHandoffURL validates tether.handoff: the netboot server as the node
// reaches it, http://HOST:PORT. Plain HTTP is what the firmware fetched the
// image over; the hand-off carries nothing a TPM node could lose, and a
// token node's one-time token is what its iPXE script would have carried.
func CheckHandoffURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "http" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return "", fmt.Errorf("%q: want http://HOST:PORT (the netboot server)", s)
	}
	return strings.TrimSuffix(s, "/"), nil
}

// maxHandoff bounds the hand-off's body: two short lines.
const maxHandoff = 4096

// HandoffSource fetches the per-boot hand-off of a node that booted a
// signed unified kernel image (ADR 0035): the image's command line carries
// the control plane's URL, the CA pin and tether.handoff, and what differs
// per boot (the instance, and the one-time token unless the TPM attests)
// comes from the netboot server, asked by the hardware address the machine
// booted with. The network is up by now (boot.Setup). It is absent when
// the command line names no hand-off.
type HandoffSource struct {
	CmdlinePath string // default /proc/cmdline
	// Client defaults to one with a 10 s timeout.
	Client *http.Client
	// Interfaces lists the NICs to ask for (default net.Interfaces).
	Interfaces func() ([]net.Interface, error)
}

func (HandoffSource) Name() string { return "netboot hand-off" }

func (s HandoffSource) Lookup(ctx context.Context) (Found, bool, error) {
	c, err := ReadCmdline(s.CmdlinePath)
	if err != nil || c.Handoff == "" {
		// A broken command line is the command line source's to report.
		return Found{}, false, nil
	}
	list := s.Interfaces
	if list == nil {
		list = net.Interfaces
	}
	ifs, err := list()
	if err != nil {
		return Found{}, false, fmt.Errorf("list network interfaces: %w", err)
	}
	client := s.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	// The machine booted from one of its NICs, and the control plane knows
	// its node by that one's address: ask with each until one is known.
	var tried []string
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagLoopback != 0 || ifi.Flags&net.FlagUp == 0 || len(ifi.HardwareAddr) != 6 {
			continue
		}
		mac := ifi.HardwareAddr.String()
		f, next, err := s.fetch(ctx, client, c.Handoff, mac)
		if err != nil {
			return Found{}, false, err
		}
		if !next {
			return Found{Fields: f}, true, nil
		}
		tried = append(tried, ifi.Name+" "+mac)
	}
	if len(tried) == 0 {
		return Found{}, false, errors.New("no network interface is up to ask for the hand-off with")
	}
	return Found{}, false, fmt.Errorf("%s knows none of this machine's addresses (%s): is the node's MAC set, and an instance of it booting?", c.Handoff, strings.Join(tried, ", "))
}

// fetch asks for mac's hand-off; next is true when the server does not
// know the address or has no boot for it, so another NIC may be the one.
func (s HandoffSource) fetch(ctx context.Context, client *http.Client, base, mac string) (Fields, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/uki/handoff?mac="+mac, nil)
	if err != nil {
		return Fields{}, false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return Fields{}, false, fmt.Errorf("fetch the hand-off from %s: %w", base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxHandoff+1))
	if err != nil {
		return Fields{}, false, fmt.Errorf("read the hand-off from %s: %w", base, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusConflict:
		return Fields{}, true, nil
	case resp.StatusCode == http.StatusGone:
		return Fields{}, false, fmt.Errorf("%s: the hand-off of %s was already fetched in this boot (by whom? the control plane has an event); reboot the instance for a fresh one", base, mac)
	case resp.StatusCode != http.StatusOK:
		return Fields{}, false, fmt.Errorf("%s: hand-off of %s: %s: %s", base, mac, resp.Status, printable(b))
	case len(b) > maxHandoff:
		return Fields{}, false, fmt.Errorf("%s: the hand-off is larger than %d bytes", base, maxHandoff)
	}
	var f Fields
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "instance":
			f.Instance = v
		case "token":
			f.Token = v
		default:
			return Fields{}, false, fmt.Errorf("%s: the hand-off has an unknown line %q", base, printable([]byte(k)))
		}
	}
	if f.Instance == "" {
		return Fields{}, false, fmt.Errorf("%s: the hand-off names no instance", base)
	}
	checked, err := f.check(func(field string) string { return "hand-off " + field })
	if err != nil {
		return Fields{}, false, fmt.Errorf("%s: %w", base, err)
	}
	return checked, false, nil
}

// printable keeps a server's text one harmless console line.
func printable(b []byte) string {
	s := strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return strings.TrimSpace(s)
}
