package tetherctl

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

var jsonOut = protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true}

// print writes m as JSON, or calls table.
func (a *App) print(m proto.Message, table func(w *tabwriter.Writer)) error {
	if a.Output == "json" {
		b, err := jsonOut.Marshal(m)
		if err != nil {
			return fmt.Errorf("encode %s as JSON: %w", m.ProtoReflect().Descriptor().Name(), err)
		}
		_, err = fmt.Fprintln(a.Stdout, string(b))
		return err
	}
	w := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

// row writes one table row. Every cell is escaped: nodes report some of
// these values, and a raw ESC, OSC or newline would drive the operator's
// terminal or forge a row.
func row(w io.Writer, cols ...any) {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = printable(fmt.Sprint(c))
	}
	fmt.Fprintln(w, strings.Join(parts, "\t"))
}

// printable escapes every rune a terminal would not just draw (control
// characters, ESC, newlines, tabs, invalid UTF-8, format characters such
// as a right-to-left override) as a Go escape: "\x1b", "\n", "\u202e".
func printable(s string) string { return escape(s, "") }

// printableText is printable for multi-line output (task output): it
// keeps newlines and tabs and escapes the rest.
func printableText(s string) string { return escape(s, "\n\t") }

func escape(s, keep string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) && !strings.ContainsRune(keep, r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r) || strings.ContainsRune(keep, r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// oneLine fits s into n runes on one line (row escapes what remains).
func oneLine(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func when(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

func ago(t *timestamppb.Timestamp) string {
	if t == nil {
		return "never"
	}
	d := time.Since(t.AsTime()).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// enumText shows INSTANCE_STATUS_RUNNING as running.
func enumText(full, prefix string) string {
	s := strings.ToLower(strings.TrimPrefix(full, prefix))
	if s == "unspecified" {
		return "-"
	}
	return s
}

// parseEnum reads a flag's lower-case enum name ("running" for
// INSTANCE_STATUS_RUNNING); "" is the zero value.
func parseEnum[T ~int32](flag, value, prefix string, values map[string]int32, want string) (T, error) {
	if value == "" {
		return 0, nil
	}
	v, ok := values[prefix+strings.ToUpper(value)]
	if !ok || v == 0 {
		return 0, fmt.Errorf("--%s %q: want %s", flag, value, want)
	}
	return T(v), nil
}

// splitRef parses NAME:VERSION.
func splitRef(s string) (string, string, error) {
	name, version, ok := strings.Cut(s, ":")
	if !ok || name == "" || version == "" {
		return "", "", fmt.Errorf("%q: want NAME:VERSION", s)
	}
	return name, version, nil
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
