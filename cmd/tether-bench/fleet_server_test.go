package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
)

// A replica killed during the hold must not end the fleet's report: its
// own figures are gone, the rest is not. Anything else that keeps the
// server from being read stays an error.
func TestSampleServerTellsAnExitedServerFromAFailure(t *testing.T) {
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "tether_heartbeats_total 42")
	}))
	defer metrics.Close()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "go_goroutines 7")
	}))
	defer broken.Close()

	exited := exec.Command("/bin/true")
	if err := exited.Run(); err != nil {
		t.Skipf("no /bin/true to play a tetherd that exited: %v", err)
	}
	cases := []struct {
		name     string
		pid      int
		metrics  string
		wantGone bool
		wantErr  bool
	}{
		{"running", os.Getpid(), metrics.URL, false, false},
		{"exited", exited.Process.Pid, metrics.URL, true, true},
		{"metrics without heartbeats", os.Getpid(), broken.URL, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := sampleServer(c.pid, c.metrics)
			if gone := errors.Is(err, errServerGone); gone != c.wantGone || (err != nil) != c.wantErr {
				t.Fatalf("err %v (gone %v); want gone %v, an error %v", err, gone, c.wantGone, c.wantErr)
			}
			if err == nil && (s.rss <= 0 || s.heartbeats != 42) {
				t.Fatalf("sample %+v: want this process's RSS and 42 heartbeats", s)
			}
		})
	}
}
