package adminkit

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Fill keeps rows in order until the byte budget is used (always at least
// one), and hands a next-page token only when rows remain after the last
// kept one; a conversion error ends the page with it.
func TestFill(t *testing.T) {
	conv := func(s string) (*wrapperspb.StringValue, error) {
		if s == "bad" {
			return nil, errors.New("bad row")
		}
		return wrapperspb.String(s), nil
	}
	key := func(s string) string { return "k-" + s }
	big := strings.Repeat("x", ListBudget/2)
	for _, tc := range []struct {
		name      string
		rows      []string
		limit     int
		kept      int
		next, err string
	}{
		{"fewer rows than asked: last page", []string{"a", "b"}, 5, 2, "", ""},
		{"as many rows as asked: more may follow", []string{"a", "b"}, 2, 2, "k-b", ""},
		{"cut by the byte budget", []string{big, big, big}, 3, 1, "k-" + big, ""},
		{"one row over the budget alone still goes", []string{big + big + big}, 1, 1, "k-" + big + big + big, ""},
		{"no rows", nil, 5, 0, "", ""},
		{"a row that does not convert", []string{"a", "bad"}, 5, 0, "", "bad row"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, next, err := Fill(tc.rows, tc.limit, conv, key)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err || got != nil {
					t.Fatalf("Fill = %d rows, %v; want no rows and %q", len(got), err, tc.err)
				}
				return
			}
			if err != nil || len(got) != tc.kept || next != tc.next {
				t.Fatalf("Fill = %d rows, next %.20q, %v; want %d, %.20q", len(got), next, err, tc.kept, tc.next)
			}
		})
	}
}
