package bench

import (
	"context"
	"errors"
	"testing"
)

// MaxConnecting lets that many agents open streams at once; the next
// waits for a place, and gives up when the fleet stops.
func TestStartConnectingBounds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f := StartFleet(ctx, FleetOptions{MaxConnecting: 2})
	defer f.cancel()
	r1, err := f.startConnecting()
	if err != nil {
		t.Fatal(err)
	}
	r2, err := f.startConnecting()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(f.connecting); n != 2 {
		t.Fatalf("%d places taken, want 2", n)
	}
	r1()
	r1() // a second release gives back nothing more
	if n := len(f.connecting); n != 1 {
		t.Fatalf("%d places taken after one release, want 1", n)
	}
	r3, err := f.startConnecting()
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() { _, err := f.startConnecting(); waiting <- err }()
	cancel()
	if err := <-waiting; !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiting agent got %v when the fleet stopped, want context.Canceled", err)
	}
	r2()
	r3()
	if n := len(f.connecting); n != 0 {
		t.Fatalf("%d places still taken, want 0", n)
	}
}
