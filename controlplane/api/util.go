package api

import (
	"strconv"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
)

func itoa(i int) string { return strconv.Itoa(i) }

func page(size int32, token string) (store.Page, error) {
	if size < 0 || size > store.MaxPageSize {
		return store.Page{}, fail.Invalid("page_size", "%d is out of range (0..%d)", size, store.MaxPageSize)
	}
	if len(token) > 256 {
		return store.Page{}, fail.Invalid("page_token", "not a token this server issued")
	}
	return store.Page{Limit: int(size), After: token}.Normalize(), nil
}

// updateMask checks an update mask against the fields an update accepts.
// An empty mask is refused: an update that names nothing would silently
// do nothing.
func updateMask(mask []string, allowed ...string) (map[string]bool, error) {
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
