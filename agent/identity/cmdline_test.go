package identity

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

const (
	testToken = "tbt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	testCA    = "sha256:abababababababababababababababababababababababababababababababab"
)

func TestParseCmdline(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Param
	}{
		{"empty", "", nil},
		{"plain", "console=ttyS0 quiet\n", []Param{{Key: "console", Value: "ttyS0", HasValue: true}, {Key: "quiet"}}},
		{"quoted value", `a="b c" d`, []Param{{Key: "a", Value: "b c", HasValue: true}, {Key: "d"}}},
		{"quoted param", `"a=b c" d`, []Param{{Key: "a", Value: "b c", HasValue: true}, {Key: "d"}}},
		{"quote inside value kept", `a=b"c d"`, []Param{{Key: "a", Value: `b"c d"`, HasValue: true}}},
		{"empty value", "a= b", []Param{{Key: "a", HasValue: true}, {Key: "b"}}},
		{"value with equals", "a=b=c", []Param{{Key: "a", Value: "b=c", HasValue: true}}},
		{"tabs and newlines", "a\tb\n\nc", []Param{{Key: "a"}, {Key: "b"}, {Key: "c"}}},
		{"leading equals", "=x", []Param{{Key: "=x"}}},
		{"empty quotes dropped", `"" a`, []Param{{Key: "a"}}},
		{"quoted empty value", `a=""`, []Param{{Key: "a", HasValue: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCmdline(tt.in)
			if err != nil {
				t.Fatalf("ParseCmdline(%q): %v", tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseCmdline(%q) = %#v, want %#v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseCmdlineUnterminatedQuote(t *testing.T) {
	_, err := ParseCmdline(`console=ttyS0 tether.url="https://x:1 tether.token=y`)
	var ce *CmdlineError
	if !errors.As(err, &ce) || ce.Param != "tether.url" || !strings.Contains(err.Error(), "unterminated") {
		t.Fatalf("error = %v, want an unterminated-quote error naming tether.url", err)
	}
}

func TestParseTetherCmdline(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		want      Cmdline
		wantParam string // for errors
		wantErr   string
	}{
		{
			name: "all three",
			in:   "console=ttyS0 tether.url=https://10.0.2.2:7443 tether.token=" + testToken + " tether.ca=" + testCA + "\n",
			want: Cmdline{Fields: Fields{URL: "https://10.0.2.2:7443", Token: testToken, CA: testCA}},
		},
		{
			name: "quoted, bare-hex CA, debug, trailing slash",
			in:   `tether.url="https://cp.example:7443/" tether.ca=` + strings.ToUpper(testCA[7:]) + " tether.debug=1",
			want: Cmdline{Fields: Fields{URL: "https://cp.example:7443", CA: testCA}, Debug: true},
		},
		{
			name: "several control planes, normalised, repeats dropped",
			in:   "tether.url=https://cp-a:7443/,https://10.0.2.3:7443,https://cp-a:7443",
			want: Cmdline{Fields: Fields{URL: "https://cp-a:7443,https://10.0.2.3:7443"}},
		},
		{name: "bad second url", in: "tether.url=https://a:1,http://b:1", wantParam: "tether.url", wantErr: "URL 2 of the list"},
		{name: "empty url in list", in: "tether.url=https://a:1,,https://b:1", wantParam: "tether.url", wantErr: "URL 2 of the list is empty"},
		{name: "bare debug", in: "tether.debug", want: Cmdline{Debug: true}},
		{name: "unknown kept as warning", in: "tether.future=1", want: Cmdline{Unknown: []string{"tether.future"}}},
		{name: "same value twice is fine", in: "tether.debug=0 tether.debug=0", want: Cmdline{}},
		{name: "no value", in: "tether.url", wantParam: "tether.url", wantErr: "has no value"},
		{name: "empty value", in: "tether.token=", wantParam: "tether.token", wantErr: "has no value"},
		{name: "http url", in: "tether.url=http://x:1", wantParam: "tether.url", wantErr: "https"},
		{name: "url with path", in: "tether.url=https://x:1/api", wantParam: "tether.url", wantErr: "only scheme"},
		{name: "bad ca", in: "tether.ca=sha256:1234", wantParam: "tether.ca", wantErr: "64 hex"},
		{name: "bad token", in: "tether.token=hunter2", wantParam: "tether.token", wantErr: "not a Tether bootstrap token"},
		{name: "conflicting duplicates", in: "tether.url=https://a:1 tether.url=https://b:1", wantParam: "tether.url", wantErr: "twice"},
		{name: "bad debug", in: "tether.debug=maybe", wantParam: "tether.debug", wantErr: "not 0 or 1"},
		{
			name: "tokenless: instance instead of a token",
			in:   "tether.url=https://10.0.2.2:7443 tether.instance=i-0123abcd tether.ca=" + testCA,
			want: Cmdline{Fields: Fields{URL: "https://10.0.2.2:7443", Instance: "i-0123abcd", CA: testCA}},
		},
		{name: "empty instance", in: "tether.instance=", wantParam: "tether.instance", wantErr: "has no value"},
		{name: "instance with a quote", in: "tether.instance=i-1/x", wantParam: "tether.instance", wantErr: "no instance id has"},
		{name: "overlong instance", in: "tether.instance=" + strings.Repeat("a", 65), wantParam: "tether.instance", wantErr: "longer than any"},
		{
			name: "announce mode",
			in:   "console=ttyS0 ip=dhcp BOOTIF=01-52-54-00-ad-00-01 tether.announce=http://10.0.2.2:8080/netboot/announce",
			want: Cmdline{Announce: "http://10.0.2.2:8080/netboot/announce"},
		},
		{name: "empty announce", in: "tether.announce=", wantParam: "tether.announce", wantErr: "has no value (want tether.announce=http://HOST:PORT/netboot/announce)"},
		{name: "announce not a URL", in: "tether.announce=ftp://x/a", wantParam: "tether.announce", wantErr: "want http://HOST:PORT/netboot/announce"},
		{name: "announce without host", in: "tether.announce=http:///a", wantParam: "tether.announce", wantErr: "want http://"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTetherCmdline(tt.in)
			if tt.wantErr != "" {
				var ce *CmdlineError
				if !errors.As(err, &ce) || ce.Param != tt.wantParam || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one naming %s and saying %q", err, tt.wantParam, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %#v, want %#v", got, tt.want)
			}
		})
	}
}

func TestTokenNeverPrinted(t *testing.T) {
	f := Fields{URL: "https://x:1", Token: testToken, CA: testCA}
	if strings.Contains(f.String(), testToken) {
		t.Fatalf("Fields.String leaks the token: %s", f)
	}
	// Short values too: FuzzFwCfgSource found an 8-byte one shown whole.
	for _, bad := range []string{"tbt_secretsecretsecret!", "00000000", "tbt_0123", "abcdefghijklm", "x"} {
		_, err := CheckToken(bad)
		if err == nil || (len(bad) > 1 && strings.Contains(err.Error(), bad)) || strings.Contains(err.Error(), "secretsecret") {
			t.Errorf("CheckToken(%q) error = %v; want an error that does not echo the token", bad, err)
		}
	}
}

// FuzzParseCmdline: no panic on any line, and what parses survives being
// rendered back with quotes.
func FuzzParseCmdline(f *testing.F) {
	f.Add("console=ttyS0 tether.url=https://10.0.2.2:7443 tether.token=" + testToken + " tether.ca=" + testCA)
	f.Add(`a="b c" "d=e f" g=h"i j" =k ""`)
	f.Add(`tether.url="https://x:1`)
	f.Fuzz(func(t *testing.T, line string) {
		params, err := ParseCmdline(line)
		_, _ = ParseTetherCmdline(line)
		if err != nil {
			return
		}
		for _, p := range params {
			if p.Key == "" {
				t.Fatalf("empty key from %q", line)
			}
			if !p.HasValue && p.Value != "" {
				t.Fatalf("value without '=' from %q", line)
			}
		}
		// Re-render parameters whose key and value are quote-free, quoting
		// values, and check they parse back the same.
		var b strings.Builder
		var simple []Param
		for _, p := range params {
			if strings.ContainsAny(p.Key, "\" \t\n\v\f\r=") || strings.Contains(p.Value, `"`) {
				continue
			}
			simple = append(simple, p)
			b.WriteString(p.Key)
			if p.HasValue {
				b.WriteString(`="` + p.Value + `"`)
			}
			b.WriteByte(' ')
		}
		again, err := ParseCmdline(b.String())
		if err != nil {
			t.Fatalf("re-rendered %q does not parse: %v", b.String(), err)
		}
		if len(again) != len(simple) {
			t.Fatalf("re-rendered %q gave %d params, want %d", b.String(), len(again), len(simple))
		}
		for i := range again {
			if again[i] != simple[i] {
				t.Fatalf("re-rendered %q: param %d = %#v, want %#v", b.String(), i, again[i], simple[i])
			}
		}
	})
}
