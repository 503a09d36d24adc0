package adminkit

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
)

// ListBudget bounds the encoded size of one list response. A page ends
// early, with a next_page_token, when the next row would pass it: rows
// carry what nodes report, and a page of large rows must stay well under
// a client's default 4 MiB receive limit, whatever the page size asked.
const ListBudget = 1 << 20

// Budget fills one list response within ListBudget.
type Budget struct {
	used int
	cut  bool
}

// Fits reports whether m still fits in the page and counts it if so. The
// first row always fits, so that every page makes progress.
func (b *Budget) Fits(m proto.Message) bool {
	// A repeated field's element costs its size plus a tag and a length.
	size := proto.Size(m)
	n := 1 + protowire.SizeVarint(uint64(size)) + size
	if b.used > 0 && b.used+n > ListBudget {
		b.cut = true
		return false
	}
	b.used += n
	return true
}

// More reports whether a page that kept `kept` of the `fetched` rows the
// store returned for a limit of `limit` has rows after it.
func (b *Budget) More(kept, fetched, limit int) bool {
	return kept > 0 && (b.cut || fetched == limit)
}

// Page checks a list request's page size and token.
func Page(size int32, token string) (store.Page, error) {
	if size < 0 || size > store.MaxPageSize {
		return store.Page{}, fail.Invalid("page_size", "%d is out of range (0..%d)", size, store.MaxPageSize)
	}
	if len(token) > 256 {
		return store.Page{}, fail.Invalid("page_token", "not a token this server issued")
	}
	return store.Page{Limit: int(size), After: token}.Normalize(), nil
}

// UpdateMask checks an update mask against the fields an update accepts.
// An empty mask is refused: an update that names nothing would silently
// do nothing.
func UpdateMask(mask []string, allowed ...string) (map[string]bool, error) {
	if len(mask) == 0 {
		return nil, fail.Invalid("update_mask", "name the fields to change (one or more of %v)", allowed)
	}
	ok := map[string]bool{}
	for _, a := range allowed {
		ok[a] = true
	}
	out := map[string]bool{}
	for _, m := range mask {
		if !ok[m] {
			return nil, fail.Invalid("update_mask", "%q is not a field this update changes (one of %v)", m, allowed)
		}
		out[m] = true
	}
	return out, nil
}

// maxQuotedInError bounds what QuoteSome quotes.
const maxQuotedInError = 64

// QuoteSome quotes the start of s for an error message: escaped, so the
// refusal does not carry what it refuses, and short.
func QuoteSome(s string) string {
	if len(s) > maxQuotedInError {
		return fmt.Sprintf("%q...", s[:maxQuotedInError])
	}
	return fmt.Sprintf("%q", s)
}

// Fill converts the rows the store returned for a page of limit, in
// order, until ListBudget is used, and returns the messages with the
// next page's token: the key of the last row kept, or "" when no row is
// left after it.
func Fill[R any, M proto.Message](rows []R, limit int, conv func(R) (M, error), key func(R) string) ([]M, string, error) {
	var b Budget
	var out []M
	for _, r := range rows {
		m, err := conv(r)
		if err != nil {
			return nil, "", err
		}
		if !b.Fits(m) {
			break
		}
		out = append(out, m)
	}
	next := ""
	if b.More(len(out), len(rows), limit) {
		next = key(rows[len(out)-1])
	}
	return out, next, nil
}
