package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/tetherfleet/tether/controlplane/netboot/dhcp"
	"github.com/tetherfleet/tether/controlplane/netboot/pxe"
	"github.com/tetherfleet/tether/controlplane/netboot/tftp"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/guard"
)

// pxeURL is the netboot URL's default when tetherd serves DHCP: the
// interface's own address, which is how machines on that link reach it.
func (o *ServeOptions) pxeURL(netLis net.Listener) error {
	if err := o.Listeners.PXE.CheckFlags(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if !o.Listeners.PXE.Enabled() {
		return nil
	}
	if netLis == nil {
		return fmt.Errorf("serve: --dhcp-interface needs --netboot-listen: DHCP points machines at the netboot HTTP server")
	}
	if err := o.Listeners.PXE.Loaders().Check(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if o.Listeners.NetbootURL == "" {
		ip, _, err := pxe.InterfaceAddr(o.Listeners.PXE.Interface)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		_, port, _ := net.SplitHostPort(netLis.Addr().String())
		o.Listeners.NetbootURL = "http://" + net.JoinHostPort(ip.String(), port)
	}
	return nil
}

// netbootLoaders are the iPXE loaders the netboot server also serves
// over HTTP: those of --ipxe-dir when tetherd answers DHCP, else none.
func (o *ServeOptions) netbootLoaders() tftp.Loaders {
	if !o.Listeners.PXE.Enabled() {
		return tftp.Loaders{}
	}
	return o.Listeners.PXE.Loaders()
}

// pxeService builds the DHCP, TFTP and router-advertisement service, or
// nil when --dhcp-interface is not given.
func (o *ServeOptions) pxeService(st store.Store, log *slog.Logger, panics *guard.Panics, uki dhcp.UKIChooser) (*pxe.Service, error) {
	if !o.Listeners.PXE.Enabled() {
		return nil, nil
	}
	cfg, err := o.Listeners.PXE.Config(o.Listeners.NetbootURL)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	return &pxe.Service{Options: o.Listeners.PXE, Config: cfg, Store: st, Clock: o.Clock, Log: log.With("component", "pxe"), Panics: panics, UKI: uki}, nil
}

func runPXE(ctx context.Context, svc *pxe.Service, log *slog.Logger) {
	if err := svc.Run(ctx); err != nil {
		log.Error("netboot DHCP/TFTP stopped", "err", err)
	}
}
