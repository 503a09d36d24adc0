package daemon

import (
	"context"
	"fmt"
	"net"
	"os"
)

// openListeners opens the gRPC, netboot and metrics ports the test did
// not hand over already, and derives from them what depends on where they
// are: the netboot URL machines are handed. Opening them before the
// services are built lets each service be given its address at
// construction (presence names this replica by its gRPC address).
func (d *daemon) openListeners(context.Context) error {
	o := &d.o
	var err error
	if d.lis == nil {
		if d.lis, err = net.Listen("tcp", o.Listeners.GRPC); err != nil {
			return fmt.Errorf("serve: listen on %s: %w", o.Listeners.GRPC, err)
		}
	}
	if d.netLis == nil && o.Listeners.Netboot != "" {
		if d.netLis, err = net.Listen("tcp", o.Listeners.Netboot); err != nil {
			return fmt.Errorf("serve: netboot listen on %s: %w", o.Listeners.Netboot, err)
		}
	}
	if err := o.pxeURL(d.netLis); err != nil {
		return err
	}
	if d.netLis != nil && o.Listeners.NetbootURL == "" {
		_, port, _ := net.SplitHostPort(d.netLis.Addr().String())
		o.Listeners.NetbootURL = "http://10.0.2.2:" + port
	}
	if d.metricsLis == nil && o.Listeners.Metrics != "" {
		if d.metricsLis, err = net.Listen("tcp", o.Listeners.Metrics); err != nil {
			return fmt.Errorf("serve: metrics listen on %s: %w", o.Listeners.Metrics, err)
		}
	}
	return nil
}

// replica is this replica's name in agent presence: stable across
// restarts on one host and port, so a restart expires what it held.
func (o *ServeOptions) replica(listen string) string {
	if o.Replica != "" {
		return o.Replica
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "tetherd"
	}
	return host + "/" + listen
}
