package api

import (
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
)

// After the fleet doubles, a stream resends its settings once, after its
// own random pause within settingsResendSpread, however many doublings
// arrive meanwhile; the next doubling after that arms a new resend.
func TestSettingsResendIsPacedAndOnce(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		draw  int64 // what the random source returns
		pause time.Duration
	}{
		{"at once", 0, 0},
		{"half way", int64(settingsResendSpread / 2), settingsResendSpread / 2},
		{"at the end", int64(settingsResendSpread) - 1, settingsResendSpread - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			var bound int64
			r := settingsResend{clock: clk, int64N: func(n int64) int64 { bound = n; return tc.draw }}
			if r.due != nil {
				t.Fatal("a resend is due before the fleet grew")
			}
			r.grew()
			first := r.due
			r.grew() // a second doubling before the resend went out
			if r.due != first {
				t.Fatal("a second doubling armed a second resend")
			}
			if bound != int64(settingsResendSpread) {
				t.Fatalf("pause drawn from [0, %v), want [0, %v)", time.Duration(bound), settingsResendSpread)
			}
			if tc.pause > 0 {
				clk.Advance(tc.pause - 1)
				select {
				case <-r.due:
					t.Fatalf("resend due %v early", time.Nanosecond)
				default:
				}
			}
			clk.Advance(1)
			select {
			case <-r.due:
			case <-time.After(10 * time.Second):
				t.Fatalf("resend not due after %v", tc.pause)
			}
			r.sent()
			if r.due != nil {
				t.Fatal("still armed after the resend")
			}
			r.grew()
			if r.due == nil {
				t.Fatal("the next doubling armed nothing")
			}
		})
	}
}
