package e2e

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/testkit/swtpmtest"
)

// BenchmarkBootAttested boots the example root directly (no firmware
// netboot) on two control planes in turn, so that both see the same
// machine load: one hands the VM a token, the other gives it its node's
// swtpm and no token, so its agent enrolls by TPM attestation. Each
// iteration is one boot of each; it reports both medians to running and
// their difference (issue 28's goal: at most +1 s). Run with:
//
//	TETHER_E2E=1 go test -tags nobadger,nobbolt,nomysql -run '^$' -bench BootAttested -benchtime 5x ./e2e/
func BenchmarkBootAttested(b *testing.B) {
	a := requireVM(b)
	swtpmtest.Require(b)
	token := newBootCP(b, a, "direct", a.rootModule, false)
	tpm := newBootCP(b, a, "direct", a.rootModule, true)
	var tok, att []time.Duration
	phases := map[string]map[string][]time.Duration{"token": {}, "tpm": {}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, side := range []struct {
			name string
			cp   *bootCP
			to   *[]time.Duration
		}{{"token", token, &tok}, {"tpm", tpm, &att}} {
			t, marks := side.cp.boot(b, i)
			*side.to = append(*side.to, t)
			for phase, at := range marks {
				phases[side.name][phase] = append(phases[side.name][phase], at)
			}
		}
	}
	b.StopTimer()
	mt, ma := median(tok), median(att)
	b.ReportMetric(mt.Seconds(), "s-running-token")
	b.ReportMetric(ma.Seconds(), "s-running-tpm")
	b.ReportMetric((ma - mt).Seconds(), "s-tpm-extra")
	fmt.Fprintf(os.Stderr, "boot to running, alternated: token %v, attested %v\n", tok, att)
	// Where the extra goes: each phase's median end, both sides.
	for _, m := range bootMarks {
		t, a := phases["token"][m.phase], phases["tpm"][m.phase]
		if len(t) > 0 && len(a) > 0 {
			fmt.Fprintf(os.Stderr, "  %-18s token %6.3f s  tpm %6.3f s  (%+.3f)\n", m.phase, median(t).Seconds(), median(a).Seconds(), (median(a) - median(t)).Seconds())
		}
	}
}
