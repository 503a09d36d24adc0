package sqlstore

import (
	"slices"
	"strings"
	"testing"
)

// A string-list column that does not parse used to read as an empty list
// without a word (`_ = json.Unmarshal`); now it is an error naming the
// column.
func TestParseList(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr string
	}{
		{"", nil, ""},
		{"[]", nil, ""},
		{`["10.0.0.1","fd00::1"]`, []string{"10.0.0.1", "fd00::1"}, ""},
		{`["10.0.0.1"`, nil, "column addresses holds"},
		{`{"a":1}`, nil, "not a JSON string list"},
	}
	for _, tc := range tests {
		got, err := parseList("addresses", tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseList(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseList(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
