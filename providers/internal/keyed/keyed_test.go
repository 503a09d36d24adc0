package keyed

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestMutex(t *testing.T) {
	k := New()
	unlock, err := k.Lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	// Another key is independent.
	unlockB, err := k.Lock(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	unlockB()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := k.Lock(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock err = %v, want deadline", err)
	}
	unlock()
	unlock() // idempotent
	u2, err := k.Lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	u2()
	if n := k.Len(); n != 0 {
		t.Fatalf("%d entries left after all unlocks", n)
	}
}
