package api

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// listBudget bounds the encoded size of one list response. A page ends
// early, with a next_page_token, when the next row would pass it: rows
// carry what nodes report, and a page of large rows must stay well under
// a client's default 4 MiB receive limit, whatever the page size asked.
const listBudget = 1 << 20

// budget fills one list response within listBudget.
type budget struct {
	used int
	cut  bool
}

// fits reports whether m still fits in the page and counts it if so. The
// first row always fits, so that every page makes progress.
func (b *budget) fits(m proto.Message) bool {
	// A repeated field's element costs its size plus a tag and a length.
	size := proto.Size(m)
	n := 1 + protowire.SizeVarint(uint64(size)) + size
	if b.used > 0 && b.used+n > listBudget {
		b.cut = true
		return false
	}
	b.used += n
	return true
}

// more reports whether a page that kept `kept` of the `fetched` rows the
// store returned for a limit of `limit` has rows after it.
func (b *budget) more(kept, fetched, limit int) bool {
	return kept > 0 && (b.cut || fetched == limit)
}
