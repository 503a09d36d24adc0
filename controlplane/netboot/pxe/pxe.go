// Package pxe runs what firmware netboot needs besides the HTTP netboot
// server: the DHCP responder on one interface, TFTP of the iPXE loaders,
// and, in full mode, IPv6 router advertisements (without one iPXE waits
// 16 s for IPv6 autoconfiguration before it boots). It is off unless an
// interface is given.
package pxe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/netboot/dhcp"
	"github.com/tetherfleet/tether/controlplane/netboot/tftp"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/guard"
)

// Options are tetherd serve's --dhcp-* flags.
type Options struct {
	Interface  string // --dhcp-interface; "" = off
	Mode       string // --dhcp-mode proxy|full
	Range      string // --dhcp-range FIRST-LAST (full)
	Router     string // --dhcp-router (full)
	DNS        string // --dhcp-dns (full)
	IPXEDir    string // --ipxe-dir
	TFTPListen string // --tftp-listen; default <interface address>:69
}

// Enabled reports whether a DHCP interface was given.
func (o Options) Enabled() bool { return o.Interface != "" }

// CheckFlags refuses option combinations that make no sense before
// anything is opened: the other --dhcp-* flags without an interface.
func (o Options) CheckFlags() error {
	if o.Interface != "" {
		if o.Mode == "" {
			return errors.New("--dhcp-interface needs --dhcp-mode proxy or full")
		}
		return nil
	}
	var given []string
	for flag, v := range map[string]string{"--dhcp-mode": o.Mode, "--dhcp-range": o.Range, "--dhcp-router": o.Router, "--dhcp-dns": o.DNS, "--tftp-listen": o.TFTPListen} {
		if v != "" {
			given = append(given, flag)
		}
	}
	if len(given) > 0 {
		return fmt.Errorf("%s need --dhcp-interface", strings.Join(given, ", "))
	}
	return nil
}

// InterfaceAddr is the first IPv4 address of an interface and its subnet.
func InterfaceAddr(name string) (netip.Addr, net.IPMask, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("--dhcp-interface %s: %w", name, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("--dhcp-interface %s: %w", name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			ip, _ := netip.AddrFromSlice(n.IP.To4())
			return ip, net.IPMask(n.Mask[len(n.Mask)-4:]), nil
		}
	}
	return netip.Addr{}, nil, fmt.Errorf("--dhcp-interface %s has no IPv4 address: give it the provisioning network's address first", name)
}

// Config resolves the options against the interface into the DHCP
// responder's configuration. httpBase is the netboot server's URL.
func (o Options) Config(httpBase string) (dhcp.Config, error) {
	ip, mask, err := InterfaceAddr(o.Interface)
	if err != nil {
		return dhcp.Config{}, err
	}
	cfg := dhcp.Config{Mode: dhcp.Mode(o.Mode), ServerIP: ip, HTTPBase: strings.TrimSuffix(httpBase, "/")}
	parse := func(flag, v string) (netip.Addr, error) {
		if v == "" {
			return netip.Addr{}, nil
		}
		a, err := netip.ParseAddr(v)
		if err != nil || !a.Is4() {
			return netip.Addr{}, fmt.Errorf("%s %q: want an IPv4 address", flag, v)
		}
		return a, nil
	}
	if o.Range != "" {
		first, last, ok := strings.Cut(o.Range, "-")
		if !ok {
			return cfg, fmt.Errorf("--dhcp-range %q: want FIRST-LAST", o.Range)
		}
		if cfg.Pool.First, err = parse("--dhcp-range", first); err != nil {
			return cfg, err
		}
		if cfg.Pool.Last, err = parse("--dhcp-range", last); err != nil {
			return cfg, err
		}
		cfg.Pool.Mask = mask
	}
	if cfg.Router, err = parse("--dhcp-router", o.Router); err != nil {
		return cfg, err
	}
	if cfg.DNS, err = parse("--dhcp-dns", o.DNS); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// Service is the running set.
type Service struct {
	Options Options
	Config  dhcp.Config
	Store   store.Store
	Clock   clock.Clock
	Log     *slog.Logger
	// Panics records panics recovered in the TFTP, DHCP and router
	// advertisement goroutines (nil: recovered, not counted).
	Panics *guard.Panics
	// UKI says which machines boot a signed unified kernel image (nil:
	// none do).
	UKI dhcp.UKIChooser
}

// Loaders is the loader directory.
func (o Options) Loaders() tftp.Loaders {
	dir := o.IPXEDir
	if dir == "" {
		dir = tftp.DefaultDir
	}
	return tftp.Loaders{Dir: dir}
}

// Run serves until ctx ends. TFTP runs on every replica (it is read-only);
// DHCP and router advertisements only on the replica leading
// "netboot-dhcp", so that one server answers and one writer leases.
func (s *Service) Run(ctx context.Context) error {
	tftpAddr := s.Options.TFTPListen
	if tftpAddr == "" {
		tftpAddr = net.JoinHostPort(s.Config.ServerIP.String(), "69")
	}
	ua, err := net.ResolveUDPAddr("udp4", tftpAddr)
	if err != nil {
		return fmt.Errorf("--tftp-listen %s: %w", tftpAddr, err)
	}
	tconn, err := net.ListenUDP("udp4", ua)
	if err != nil {
		return fmt.Errorf("tftp: listen on %s: %w", tftpAddr, err)
	}
	ts := &tftp.Server{Loaders: s.Options.Loaders(), Log: s.Log.With("component", "tftp"), Clock: s.Clock, Panics: s.Panics}
	tdone := make(chan error, 1)
	go func() { tdone <- ts.Serve(ctx, tconn) }()
	s.Log.Info("tftp serving the iPXE loaders", "addr", tconn.LocalAddr().String(), "dir", ts.Loaders.Dir)

	h := &dhcp.Handler{Config: s.Config, Now: s.Clock.Now, UKI: s.UKI}
	if s.Config.Mode == dhcp.Full {
		h.Leases = &dhcp.StoreLeases{Store: s.Store, Pool: s.Config.Pool}
	}
	srv := &dhcp.Server{Interface: s.Options.Interface, Handler: h, Log: s.Log.With("component", "dhcp"), Panics: s.Panics}
	for ctx.Err() == nil {
		lead, release, err := s.Store.Elector().Campaign(ctx, "netboot-dhcp")
		if err != nil {
			break
		}
		s.Log.Info("dhcp answering", "interface", s.Options.Interface, "mode", s.Config.Mode, "server", s.Config.ServerIP.String())
		if s.Config.Mode == dhcp.Full {
			// Opened here, not in the goroutine: sockets belong to the
			// caller's network namespace (tests run Run inside one).
			if c, ifi := s.openRA(); c != nil {
				go s.advertise(lead, c, ifi)
			}
		}
		err = srv.Serve(lead)
		release()
		if err != nil {
			s.Log.Error("dhcp stopped", "err", err)
			// A socket that cannot be opened now will not open in a
			// tight loop either.
			t := time.NewTimer(5 * time.Second)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
	return <-tdone
}
