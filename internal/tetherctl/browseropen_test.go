package tetherctl

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --open hands the browser a private page, never the secret-bearing URL:
// no argument carries the secret, the page is 0600 in a 0700 directory,
// it redirects to the URL, and cleanup removes it.
func TestOpenInBrowserKeepsTheSecretOffTheCommandLine(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef"
	url := "http://127.0.0.1:4242/t/" + secret + "/"
	var argv []string
	cleanup, err := openInBrowser(url, func(name string, args ...string) error {
		argv = append([]string{name}, args...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(argv) != 2 || argv[0] != "xdg-open" {
		t.Fatalf("ran %q", argv)
	}
	for _, a := range argv {
		if strings.Contains(a, secret) {
			t.Fatalf("the secret is on the command line: %q", argv)
		}
	}
	page := argv[1]
	for path, want := range map[string]os.FileMode{page: 0o600, filepath.Dir(page): 0o700} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s has mode %04o, want %04o", path, fi.Mode().Perm(), want)
		}
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `http-equiv=refresh content="0;url=`+url+`"`) {
		t.Fatalf("the page does not redirect to the dashboard:\n%s", b)
	}
	cleanup()
	if _, err := os.Stat(filepath.Dir(page)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("cleanup left %s: %v", filepath.Dir(page), err)
	}
}

// A browser that cannot be started leaves no page behind.
func TestOpenInBrowserFailureCleansUp(t *testing.T) {
	var page string
	_, err := openInBrowser("http://127.0.0.1:1/t/x/", func(_ string, args ...string) error {
		page = args[0]
		return errors.New("no xdg-open")
	})
	if err == nil || !strings.Contains(err.Error(), "no xdg-open") {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(filepath.Dir(page)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed open left %s: %v", filepath.Dir(page), err)
	}
}
