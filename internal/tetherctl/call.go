package tetherctl

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// rpc is a unary admin method as a method expression, e.g.
// v1.AdminServiceClient.GetNode.
type rpc[Req, Resp any] func(v1.AdminServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error)

// invoke dials and makes one call under the --timeout deadline.
func invoke[Req, Resp any](a *App, method rpc[Req, Resp], req Req) (Resp, error) {
	var zero Resp
	c, err := a.dial()
	if err != nil {
		return zero, err
	}
	ctx, cancel := a.ctx()
	defer cancel()
	return method(c, ctx, req)
}

// call makes one call and prints its answer: JSON, or the table render writes.
func call[Req any, Resp proto.Message](a *App, method rpc[Req, Resp], req Req, render func(*tabwriter.Writer, Resp)) error {
	resp, err := invoke(a, method, req)
	if err != nil {
		return err
	}
	return a.print(resp, func(w *tabwriter.Writer) { render(w, resp) })
}

// one adapts a table of many rows to a single message.
func one[T any](table func(*tabwriter.Writer, []T)) func(*tabwriter.Writer, T) {
	return func(w *tabwriter.Writer, x T) { table(w, []T{x}) }
}

// maxPageSize is the largest page_size the API documents. It is only a
// request: the server may answer with fewer rows and a next_page_token
// (a response-size budget, say), so the client never infers the end of a
// list from a page's length.
const maxPageSize = 1000

// paging is the --limit and --page-token of a list command.
type paging struct {
	limit int
	token string
}

func (p *paging) flags(f *pflag.FlagSet, defaultLimit int, what string) {
	f.IntVar(&p.limit, "limit", defaultLimit, "at most this many "+what+" (0: all)")
	f.StringVar(&p.token, "page-token", "", "continue a list cut by --limit (the token it printed)")
}

// list pages through a List method until the list ends or --limit rows are
// in, then prints them all as one response (-o json gives the whole list).
// When the limit cuts the list it says so on stderr, with how to get the rest.
func list[Req, Resp proto.Message](a *App, method rpc[Req, Resp], req Req, pg paging, render func(*tabwriter.Writer, Resp)) error {
	all, err := fetchAll(a, method, req, pg)
	if err != nil {
		return err
	}
	items, _, next := listFields(all)
	if cut := pg.limit > 0 && (all.ProtoReflect().Get(items).List().Len() >= pg.limit); cut {
		if tok := all.ProtoReflect().Get(next).String(); tok != "" {
			fmt.Fprintf(a.Stderr, "tetherctl: showing the first %d %s; more remain. --limit 0 lists them all; --page-token %s continues after these\n",
				pg.limit, items.Name(), tok)
		}
	}
	return a.print(all, func(w *tabwriter.Writer) { render(w, all) })
}

// fetchAll follows next_page_token. Requests and responses are matched by
// field name (page_size, page_token, next_page_token and the one repeated
// field), which every List method of the API shares.
func fetchAll[Req, Resp proto.Message](a *App, method rpc[Req, Resp], req Req, pg paging) (Resp, error) {
	var acc Resp
	if pg.limit < 0 {
		return acc, fmt.Errorf("--limit %d: want 0 (all) or more", pg.limit)
	}
	r := req.ProtoReflect()
	sizeF, tokenF := r.Descriptor().Fields().ByName("page_size"), r.Descriptor().Fields().ByName("page_token")
	if sizeF == nil || tokenF == nil {
		return acc, fmt.Errorf("%s has no page_size/page_token", r.Descriptor().FullName())
	}
	token, got, first := pg.token, 0, true
	for {
		size := maxPageSize
		if pg.limit > 0 && pg.limit-got < size {
			size = pg.limit - got
		}
		r.Set(sizeF, protoreflect.ValueOfInt32(int32(size)))
		r.Set(tokenF, protoreflect.ValueOfString(token))
		page, err := invoke(a, method, req)
		if err != nil {
			if got > 0 {
				return acc, fmt.Errorf("after %d rows: %w", got, err)
			}
			return acc, err
		}
		items, n, next := listFields(page)
		if items == nil {
			return acc, errors.New("a list response without a repeated field")
		}
		nextToken := page.ProtoReflect().Get(next).String()
		got += n
		if first {
			acc, first = page, false
		} else {
			proto.Merge(acc, page) // appends the rows
		}
		ar := acc.ProtoReflect()
		ar.Set(next, protoreflect.ValueOfString(nextToken))
		if pg.limit > 0 && got > pg.limit {
			// More rows than asked for: the token continues after the
			// last row received, not after the last row shown, so it is
			// dropped rather than skip rows; raising --limit still works.
			ar.Mutable(items).List().Truncate(pg.limit)
			ar.Clear(next)
			fmt.Fprintf(a.Stderr, "tetherctl: showing the first %d %s; more remain. --limit 0 lists them all\n", pg.limit, items.Name())
			return acc, nil
		}
		if nextToken == "" || (pg.limit > 0 && got >= pg.limit) {
			return acc, nil
		}
		if nextToken == token {
			return acc, fmt.Errorf("the server returned page token %q twice; stopping after %d rows", token, got)
		}
		token = nextToken
	}
}

// listFields finds a list response's repeated field, its length and its
// next_page_token field.
func listFields(m proto.Message) (items protoreflect.FieldDescriptor, n int, next protoreflect.FieldDescriptor) {
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		if f := fields.Get(i); f.IsList() && f.Message() != nil {
			items, n = f, r.Get(f).List().Len()
			break
		}
	}
	return items, n, fields.ByName("next_page_token")
}
