package logbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestBuffer(t *testing.T) {
	tests := []struct {
		name    string
		writers int
		lines   int
	}{
		{"one writer", 1, 10},
		{"many writers", 16, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Buffer
			var wg sync.WaitGroup
			for w := range tt.writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range tt.lines {
						fmt.Fprintf(&b, "w%d l%d\n", w, i)
						_ = b.String() // reads beside the writes
					}
				}()
			}
			wg.Wait()
			if got := strings.Count(b.String(), "\n"); got != tt.writers*tt.lines {
				t.Fatalf("%d lines, want %d", got, tt.writers*tt.lines)
			}
		})
	}
}

func TestAwait(t *testing.T) {
	var b Buffer
	done := make(chan bool)
	go func() { done <- b.Await(time.Minute, func(s string) bool { return strings.Contains(s, "ready") }) }()
	fmt.Fprintln(&b, "starting")
	fmt.Fprintln(&b, "ready")
	if !<-done {
		t.Fatal("Await did not see a line written after it began")
	}
	if !b.Await(0, func(s string) bool { return strings.Contains(s, "starting") }) {
		t.Fatal("Await did not see what was already there")
	}
	if b.Await(time.Millisecond, func(s string) bool { return strings.Contains(s, "never") }) {
		t.Fatal("Await reported text that was never written")
	}
}
