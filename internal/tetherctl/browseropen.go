package tetherctl

import (
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
)

// openInBrowser opens url without putting it on a command line: the
// dashboard's URL carries its per-run secret, and a process's arguments
// are readable by every local user (ps, /proc/PID/cmdline). It writes a
// page that redirects to url into a new directory only this user may
// enter (0700, the page 0600) and hands run, xdg-open by default, the
// page's path. cleanup removes both; the dashboard calls it as it stops.
func openInBrowser(url string, run func(name string, args ...string) error) (cleanup func(), err error) {
	if run == nil {
		run = func(name string, args ...string) error { return exec.Command(name, args...).Start() }
	}
	dir, err := os.MkdirTemp("", "tetherctl-dashboard-")
	if err != nil {
		return func() {}, fmt.Errorf("--open: %w", err)
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	// MkdirTemp makes the directory 0700 already; say so where it matters.
	if err := os.Chmod(dir, 0o700); err != nil {
		cleanup()
		return func() {}, fmt.Errorf("--open: %w", err)
	}
	u := html.EscapeString(url)
	page := "<!doctype html>\n<meta charset=utf-8>\n<meta name=referrer content=no-referrer>\n" +
		"<meta http-equiv=refresh content=\"0;url=" + u + "\">\n<title>Tether dashboard</title>\n" +
		"<p><a href=\"" + u + "\">Open the Tether dashboard</a></p>\n"
	path := filepath.Join(dir, "dashboard.html")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		_, err = f.WriteString(page)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		cleanup()
		return func() {}, fmt.Errorf("--open: %w", err)
	}
	if err := run("xdg-open", path); err != nil {
		cleanup()
		return func() {}, fmt.Errorf("--open: %w", err)
	}
	return cleanup, nil
}
