package identity

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/tetherfleet/tether/pki"
)

// Kernel command line parameters the agent reads.
const (
	ParamURL   = "tether.url"
	ParamToken = "tether.token"
	ParamCA    = "tether.ca"
	// ParamInstance names the instance of a tokenless, TPM-attested boot.
	ParamInstance = "tether.instance"
	ParamDebug    = "tether.debug"
	// ParamHandoff is the netboot server a node that booted a signed
	// image fetches its per-boot hand-off from (handoff.go).
	ParamHandoff = "tether.handoff"
	// ParamAnnounce puts the agent in announce mode: the machine is
	// unknown, and the agent announces its TPM to this netboot server
	// route (docs/adr/0030).
	ParamAnnounce = "tether.announce"
)

// Param is one parameter of a kernel command line, as the kernel splits it.
type Param struct {
	Key   string
	Value string
	// HasValue tells "key=" (empty value) from a bare "key".
	HasValue bool
}

// CmdlineError names the parameter that is wrong and why.
type CmdlineError struct {
	Param  string
	Reason string
}

func (e *CmdlineError) Error() string {
	if e.Param == "" {
		return "kernel command line: " + e.Reason
	}
	return fmt.Sprintf("kernel command line: parameter %s: %s", e.Param, e.Reason)
}

// maxCmdline is far above any real kernel's limit (COMMAND_LINE_SIZE is
// 2048 on x86, 4096 on arm64); it only bounds a hostile input.
const maxCmdline = 64 << 10

// ParseCmdline splits a kernel command line the way the kernel does
// (lib/cmdline.c next_arg): parameters are separated by whitespace, double
// quotes protect whitespace, and a quote that opens a value ("key="a b"")
// or the whole parameter (""key=a b"") is dropped from the result. Where the
// kernel quietly runs an unterminated quote to the end of the line, this
// refuses it, naming the parameter: a value swallowing the rest of the line
// is never what the operator meant.
func ParseCmdline(s string) ([]Param, error) {
	if len(s) > maxCmdline {
		return nil, &CmdlineError{Reason: fmt.Sprintf("longer than %d bytes", maxCmdline)}
	}
	var params []Param
	for i := 0; ; {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i == len(s) {
			return params, nil
		}
		start := i
		quoted := s[i] == '"'
		if quoted {
			i++
		}
		inQuote := quoted
		equals := -1
		for ; i < len(s); i++ {
			c := s[i]
			if isSpace(c) && !inQuote {
				break
			}
			// As in the kernel, a leading '=' does not split: "=x" is a
			// parameter named "=x".
			if equals < 0 && c == '=' && i > start+btoi(quoted) {
				equals = i
			}
			if c == '"' {
				inQuote = !inQuote
			}
		}
		raw := s[start:i]
		if inQuote {
			return nil, &CmdlineError{Param: paramName(raw), Reason: "unterminated double quote"}
		}
		// An empty parameter ("" on its own) is dropped, as the kernel
		// ignores it.
		if p := splitParam(s, start, i, quoted, equals); p.Key != "" {
			params = append(params, p)
		}
	}
}

// splitParam applies the kernel's quote stripping to s[start:end].
func splitParam(s string, start, end int, quoted bool, equals int) Param {
	keyStart := start
	if quoted {
		keyStart++
	}
	// A quote closing a quoted parameter or a quoted value is dropped.
	trimClose := func(v string) string { return strings.TrimSuffix(v, `"`) }
	if equals < 0 {
		key := s[keyStart:end]
		if quoted {
			key = trimClose(key)
		}
		return Param{Key: key}
	}
	key := s[keyStart:equals]
	val := s[equals+1 : end]
	if strings.HasPrefix(val, `"`) {
		val = trimClose(val[1:])
	} else if quoted {
		val = trimClose(val)
	}
	return Param{Key: key, Value: val, HasValue: true}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func paramName(raw string) string {
	raw = strings.TrimPrefix(raw, `"`)
	if i := strings.IndexByte(raw, '='); i >= 0 {
		raw = raw[:i]
	}
	if len(raw) > 64 {
		raw = raw[:64] + "..."
	}
	return raw
}

func isSpace(c byte) bool {
	// The kernel's isspace: space, \t, \n, \v, \f, \r.
	return c == ' ' || (c >= '\t' && c <= '\r')
}

// Cmdline is what the agent takes from the kernel command line.
type Cmdline struct {
	Fields
	Debug bool
	// Announce is the netboot server's announce route (tether.announce=).
	Announce string
	// Signers is the node's signer anchor from tether.signers=.
	Signers []string
	// Handoff is tether.handoff=, the netboot server's http:// URL.
	Handoff string
	// Unknown lists tether.* parameters this agent does not know, so the
	// console can say they were ignored (a newer control plane may pass
	// parameters an older agent predates).
	Unknown []string
}

// ParseTetherCmdline extracts and checks the tether.* parameters.
func ParseTetherCmdline(s string) (Cmdline, error) {
	params, err := ParseCmdline(s)
	if err != nil {
		return Cmdline{}, err
	}
	var c Cmdline
	seen := make(map[string]string)
	for _, p := range params {
		if !strings.HasPrefix(p.Key, "tether.") {
			continue
		}
		// tether.signers may appear more than once (the template's arguments
		// and the provider's): the anchors join.
		if prev, dup := seen[p.Key]; dup && prev != p.Value && p.Key != ParamSigners {
			return Cmdline{}, &CmdlineError{Param: p.Key, Reason: "given twice with different values; keep one"}
		}
		seen[p.Key] = p.Value
		switch p.Key {
		case ParamURL, ParamToken, ParamCA, ParamInstance, ParamAnnounce:
			if !p.HasValue || p.Value == "" {
				return Cmdline{}, &CmdlineError{Param: p.Key, Reason: "has no value (want " + p.Key + "=" + placeholder(p.Key) + ")"}
			}
		}
		switch p.Key {
		case ParamURL:
			v, err := CheckURL(p.Value)
			if err != nil {
				return Cmdline{}, &CmdlineError{Param: p.Key, Reason: err.Error()}
			}
			c.URL = v
		case ParamToken:
			v, err := CheckToken(p.Value)
			if err != nil {
				return Cmdline{}, &CmdlineError{Param: p.Key, Reason: err.Error()}
			}
			c.Token = v
		case ParamCA:
			v, err := CheckCA(p.Value)
			if err != nil {
				return Cmdline{}, &CmdlineError{Param: p.Key, Reason: err.Error()}
			}
			c.CA = v
		case ParamInstance:
			v, err := CheckInstance(p.Value)
			if err != nil {
				return Cmdline{}, &CmdlineError{Param: p.Key, Reason: err.Error()}
			}
			c.Instance = v
		case ParamAnnounce:
			u, err := url.Parse(p.Value)
			if err != nil || u.Scheme != "http" || u.Host == "" {
				return Cmdline{}, &CmdlineError{Param: p.Key, Reason: "want http://HOST:PORT/netboot/announce"}
			}
			c.Announce = p.Value
		case ParamSigners:
			fps, err := pki.ParseSignerList(p.Value)
			if err != nil {
				return Cmdline{}, &CmdlineError{Param: p.Key, Reason: err.Error() + " (want tether.signers=sha256:HEX[,sha256:HEX])"}
			}
			if len(fps) == 0 {
				return Cmdline{}, &CmdlineError{Param: p.Key, Reason: "has no value (want tether.signers=sha256:HEX[,sha256:HEX])"}
			}
			for _, fp := range fps {
				if !slices.Contains(c.Signers, fp) {
					c.Signers = append(c.Signers, fp)
				}
			}
		case ParamHandoff:
			v, err := CheckHandoffURL(p.Value)
			if err != nil {
				return Cmdline{}, &CmdlineError{Param: p.Key, Reason: err.Error()}
			}
			c.Handoff = v
		case ParamDebug:
			switch strings.ToLower(p.Value) {
			case "", "1", "true", "yes", "on":
				c.Debug = true
			case "0", "false", "no", "off":
				c.Debug = false
			default:
				return Cmdline{}, &CmdlineError{Param: p.Key, Reason: fmt.Sprintf("value %q is not 0 or 1", p.Value)}
			}
		default:
			c.Unknown = append(c.Unknown, p.Key)
		}
	}
	return c, nil
}

func placeholder(key string) string {
	switch key {
	case ParamURL:
		return "https://HOST:PORT"
	case ParamToken:
		return "TOKEN"
	case ParamInstance:
		return "INSTANCE_ID"
	case ParamAnnounce:
		return "http://HOST:PORT/netboot/announce"
	default:
		return "sha256:HEX"
	}
}

var errNotHTTPS = errors.New("want https://HOST:PORT[,https://HOST:PORT...]")

// CheckURL validates a control plane URL, or several separated by commas
// (replicas the agent moves between when one refuses or is down), and
// returns them normalised (no trailing slash, no blanks, no repeats).
func CheckURL(s string) (string, error) {
	if !strings.Contains(s, ",") {
		return checkOneURL(s)
	}
	var out []string
	seen := map[string]bool{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return "", fmt.Errorf("%q: URL %d of the list is empty (%w)", s, i+1, errNotHTTPS)
		}
		u, err := checkOneURL(part)
		if err != nil {
			return "", fmt.Errorf("URL %d of the list: %w", i+1, err)
		}
		if !seen[u] {
			seen[u] = true
			out = append(out, u)
		}
	}
	return strings.Join(out, ","), nil
}

func checkOneURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("%q is not a URL: %w", s, errNotHTTPS)
	}
	if u.Scheme != "https" || u.Host == "" || u.Hostname() == "" {
		return "", fmt.Errorf("%q: %w", s, errNotHTTPS)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return "", fmt.Errorf("%q: want only scheme, host and port (%w)", s, errNotHTTPS)
	}
	if p := u.Port(); p == "" && strings.HasSuffix(u.Host, ":") {
		return "", fmt.Errorf("%q: empty port (%w)", s, errNotHTTPS)
	}
	return "https://" + u.Host, nil
}
