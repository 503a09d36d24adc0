package store

import "strings"

// Page cursors (Page.After) are the sort key of the last row of a page.
// Most lists sort by one column and use it as is; the ones whose key has
// several columns encode them here, beside the stores that decode them.

// ModuleCursor is the page cursor after m: modules page in (name,
// version) order.
func ModuleCursor(m *Module) string { return m.Name + "\x00" + m.Version }

// SplitModuleCursor reads a ModuleCursor back.
func SplitModuleCursor(after string) (name, version string) {
	name, version, _ = strings.Cut(after, "\x00")
	return name, version
}
