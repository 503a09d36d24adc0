package libvirt

import (
	"context"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/tetherfleet/tether/providers"
)

// A Tether domain that stops or crashes is reported at once; other
// domains and other events are not; after libvirtd drops the stream the
// follower reconnects and reports again.
func TestLifecycleEventsReportExits(t *testing.T) {
	f := newUnit(t, nil)
	f.lv.subscribed = make(chan struct{}, 4)
	exits := make(chan providers.Exit, 8)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.p.WatchExits(wctx, func(e providers.Exit) { exits <- e })
	waitFor := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s", what)
		}
	}
	waitFor("subscription", f.lv.subscribed)

	f.lv.emit("someone-elses-vm", golibvirt.DomainEventStopped, 0)
	f.lv.emit(DomainPrefix+"i-1", golibvirt.DomainEventStarted, 0)
	f.lv.emit(DomainPrefix+"i-1", golibvirt.DomainEventCrashed, 0)
	f.lv.emit(DomainPrefix+"i-2", golibvirt.DomainEventStopped, 5)
	for _, want := range []string{"i-1", "i-2"} {
		select {
		case e := <-exits:
			if e.InstanceID != want || e.MachineID != want || e.Detail == "" {
				t.Fatalf("exit %+v, want instance %s", e, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no exit reported for %s", want)
		}
	}
	select {
	case e := <-exits:
		t.Fatalf("unexpected exit %+v (another domain's, or a start)", e)
	default:
	}

	// libvirtd restarts: the stream ends; the follower reconnects after
	// eventRetry.
	f.lv.dropEvents()
	bctx, bcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer bcancel()
	if err := f.clk.BlockUntil(bctx, 1); err != nil {
		t.Fatalf("the follower never waited to reconnect: %v", err)
	}
	f.clk.Advance(eventRetry)
	waitFor("resubscription", f.lv.subscribed)
	f.lv.emit(DomainPrefix+"i-3", golibvirt.DomainEventStopped, 0)
	select {
	case e := <-exits:
		if e.InstanceID != "i-3" {
			t.Fatalf("exit %+v after the reconnect, want i-3", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after the reconnect")
	}
}
