package agenthub

import (
	"math/bits"
	"time"
)

// HeartbeatInterval stretches the 30 s heartbeat with fleet size so that
// the control plane sees at most MaxHeartbeatsPerSecond (docs/design.md §2.8, Nomad's
// rule).
func HeartbeatInterval(connected int) time.Duration {
	d := BaseHeartbeatInterval
	if scaled := time.Duration(float64(connected) / MaxHeartbeatsPerSecond * float64(time.Second)); scaled > d {
		d = scaled
	}
	return d
}

// ReconnectSpread is the window over which this replica's agents spread
// their reconnections after losing it: long enough that they arrive at
// most MaxReconnectsPerSecond, at most MaxReconnectSpread. A small fleet
// gets a few milliseconds and comes straight back; 19,000 agents spread
// over 38 s. Without it every agent's back-off started at the same
// 500 ms, 19,000 TLS handshakes landed in one second on a tetherd that
// had just restarted, most missed the handshake deadline, and their
// retries kept the CPU starved (docs/reliability.md, reconnect storm).
func ReconnectSpread(connected int) time.Duration {
	d := time.Duration(float64(connected) / MaxReconnectsPerSecond * float64(time.Second))
	return min(d, MaxReconnectSpread)
}

// SettingsTier grows by one each time the connected fleet doubles past
// one second's worth of reconnections. A replica resends its settings to
// every stream when the tier rises, so the agents that connected while
// the fleet was small learn the longer reconnection window too: told only
// at connect time, the first agents kept windows of a second or two and
// a restart brought them all back in its first second.
func SettingsTier(connected int) int {
	return bits.Len(uint(connected / int(MaxReconnectsPerSecond)))
}

// Heartbeat and reconnection rate limits. MaxReconnectsPerSecond is a
// fraction of what one tetherd admitted on two shared cores (bursts of
// 1,700 new streams a second): a reconnection costs a TLS handshake and
// a stream, far more than a heartbeat. MaxReconnectSpread stays well
// inside liveness' 3-minute silent threshold.
const (
	BaseHeartbeatInterval  = 30 * time.Second
	MaxHeartbeatsPerSecond = 2000.0
	MaxReconnectsPerSecond = 500.0
	MaxReconnectSpread     = 60 * time.Second
)
