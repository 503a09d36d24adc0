package backup

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"filippo.io/age"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var when = time.Date(2026, 12, 4, 3, 0, 0, 0, time.UTC)

// dataDir lays out a small data dir: keys, a blob, VM state and uploads
// that a backup leaves out.
func dataDir(t *testing.T) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "data")
	for name, body := range map[string]string{
		"ca/ca.key": "CA KEY", "ca/ca.crt": "CA CERT", "server.key": "SERVER KEY", "credentials.key": "SEAL",
		"blobs/sha256/aa": "module bytes", "blobs/tmp/upload": "half a push", "machines/vm1/disk": "vm state",
		DatabaseName: "live db", DatabaseName + "-wal": "wal",
	} {
		p := filepath.Join(d, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func source(dir string, schema int) Source {
	return Source{DataDir: dir, Store: "sqlite", CAFingerprint: "sha256:ca", Now: func() time.Time { return when },
		Snapshot:      func(_ context.Context, dst string) error { return os.WriteFile(dst, []byte("snapshot db"), 0o600) },
		SchemaVersion: func(context.Context, string) (int, error) { return schema, nil },
		Skip: func(rel string, d fs.DirEntry) bool {
			return rel == "machines" || rel == "blobs/tmp"
		}}
}

func create(t *testing.T, src Source, enc Encryption) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "b.tbk")
	if _, err := Create(context.Background(), src, enc, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// ageKey makes an age X25519 identity: its recipient string and the
// identity file's text, as age-keygen writes them.
func ageKey(t *testing.T) (recipient, identity string) {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id.Recipient().String(), "# created by a test\n" + id.String() + "\n"
}

func TestRoundTrip(t *testing.T) {
	src := dataDir(t)
	r1, id1 := ageKey(t)
	r2, id2 := ageKey(t)
	for _, tc := range []struct {
		name string
		enc  Encryption
		dec  Decryption
	}{
		{"clear", Encryption{}, Decryption{}},
		{"passphrase", Encryption{Passphrase: "correct horse", workFactor: 10}, Decryption{Passphrase: "correct horse"}},
		{"one recipient", Encryption{Recipients: []string{r1}}, Decryption{Identities: id1}},
		{"two recipients, the second's identity", Encryption{Recipients: []string{r1, r2}}, Decryption{Identities: id2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := create(t, source(src, 8), tc.enc)
			if st, _ := os.Stat(out); st.Mode().Perm() != 0o600 {
				t.Fatalf("backup mode %v, want 0600", st.Mode().Perm())
			}
			dst := filepath.Join(t.TempDir(), "restored")
			m, err := Restore(context.Background(), out, tc.dec, dst, RestoreOptions{MaxSchema: 8, Now: func() time.Time { return when.Add(time.Hour) }})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"ca/ca.key": "CA KEY", "ca/ca.crt": "CA CERT", "server.key": "SERVER KEY", "credentials.key": "SEAL",
				"blobs/sha256/aa": "module bytes", DatabaseName: "snapshot db"}
			if len(m.Files) != len(want) {
				t.Errorf("manifest has %d files, want %d: %+v", len(m.Files), len(want), m.Files)
			}
			for name, body := range want {
				got, err := os.ReadFile(filepath.Join(dst, filepath.FromSlash(name)))
				if err != nil || string(got) != body {
					t.Errorf("%s: %q, %v; want %q", name, got, err, body)
				}
			}
			for _, gone := range []string{"blobs/tmp/upload", "machines/vm1/disk", DatabaseName + "-wal"} {
				if _, err := os.Stat(filepath.Join(dst, gone)); err == nil {
					t.Errorf("%s was restored; a backup leaves it out", gone)
				}
			}
			mk, ok, err := ReadMarker(dst)
			if err != nil || !ok || !mk.BackupCreated.Equal(when) || !mk.Restored.Equal(when.Add(time.Hour)) {
				t.Fatalf("marker %+v, %v, %v", mk, ok, err)
			}
		})
	}
}

func TestKeysOnlyLeavesOutTheDatabaseAndBlobs(t *testing.T) {
	src := source(dataDir(t), 0)
	src.KeysOnly, src.Snapshot, src.SchemaVersion = true, nil, nil
	out := create(t, src, Encryption{})
	f, _ := os.Open(out)
	defer f.Close()
	m, _, err := Open(f, Decryption{}, RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, fm := range m.Files {
		if fm.Path == DatabaseName || strings.HasPrefix(fm.Path, "blobs/") {
			t.Errorf("a keys-only backup holds %s", fm.Path)
		}
	}
	if !m.KeysOnly || len(m.Files) != 4 {
		t.Fatalf("keys-only manifest: %+v", m)
	}
}

func TestCreateRefusesToOverwrite(t *testing.T) {
	out := filepath.Join(t.TempDir(), "old.tbk")
	if err := os.WriteFile(out, []byte("an older backup"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(context.Background(), source(dataDir(t), 8), Encryption{}, out); err == nil {
		t.Fatal("a backup overwrote an existing file")
	}
	if b, _ := os.ReadFile(out); string(b) != "an older backup" {
		t.Fatalf("the older backup was changed: %q", b)
	}
}

// rewrite rebuilds an archive with edit applied to its entries.
func rewrite(t *testing.T, in string, edit func(name string, body []byte) (string, []byte, bool)) string {
	t.Helper()
	raw, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(raw))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		name, body, keep := edit(h.Name, body)
		if !keep {
			continue
		}
		h.Name, h.Size = name, int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	out := filepath.Join(t.TempDir(), "edited.tbk")
	if err := os.WriteFile(out, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

func editManifest(t *testing.T, in string, f func(*Manifest)) string {
	return rewrite(t, in, func(name string, body []byte) (string, []byte, bool) {
		if name != ManifestName {
			return name, body, true
		}
		var m Manifest
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatal(err)
		}
		f(&m)
		b, _ := json.Marshal(m)
		return name, b, true
	})
}

func TestRestoreRefusesBadBackups(t *testing.T) {
	good := create(t, source(dataDir(t), 8), Encryption{})
	sealed := create(t, source(dataDir(t), 8), Encryption{Passphrase: "right", workFactor: 10})
	r1, _ := ageKey(t)
	_, other := ageKey(t)
	toKey := create(t, source(dataDir(t), 8), Encryption{Recipients: []string{r1}})
	raw, _ := os.ReadFile(good)
	write := func(b []byte) string {
		p := filepath.Join(t.TempDir(), "x.tbk")
		os.WriteFile(p, b, 0o600)
		return p
	}
	corrupt := append([]byte(nil), raw...)
	// Flip a byte of the last file's body (after the manifest and headers).
	i := bytes.Index(corrupt, []byte("SERVER KEY"))
	corrupt[i] ^= 0xff
	tests := []struct {
		name, file string
		dec        Decryption
		max        int
		want       string
	}{
		{"corrupt byte", write(corrupt), Decryption{}, 8, "checksum"},
		{"truncated mid-file", write(raw[:len(raw)/2]), Decryption{}, 8, "truncated"},
		{"truncated at the manifest", write(raw[:700]), Decryption{}, 8, "truncated"},
		{"a file left out", rewrite(t, good, func(n string, b []byte) (string, []byte, bool) { return n, b, n != "server.key" }), Decryption{}, 8, "missing"},
		{"a file it does not list", rewrite(t, good, func(n string, b []byte) (string, []byte, bool) {
			if n == "server.key" {
				return "extra.key", b, true
			}
			return n, b, true
		}), Decryption{}, 8, "not in its manifest"},
		{"foreign file", write([]byte("#!/bin/sh\necho not a backup\n")), Decryption{}, 8, "not a Tether backup"},
		{"foreign tar", rewrite(t, good, func(n string, b []byte) (string, []byte, bool) {
			if n == ManifestName {
				return "README", b, true
			}
			return n, b, true
		}), Decryption{}, 8, "not a Tether backup"},
		{"another format", editManifest(t, good, func(m *Manifest) { m.Format = "something-else" }), Decryption{}, 8, "not a Tether backup"},
		{"a newer format", editManifest(t, good, func(m *Manifest) { m.Version = Version + 1 }), Decryption{}, 8, "format is version"},
		{"a newer schema", good, Decryption{}, 7, "schema 8 and this build knows up to 7"},
		{"a path outside the data dir", editManifest(t, good, func(m *Manifest) { m.Files[0].Path = "../escape" }), Decryption{}, 8, "may not"},
		{"an absolute path", editManifest(t, good, func(m *Manifest) { m.Files[0].Path = "/etc/passwd" }), Decryption{}, 8, "may not"},
		{"encrypted, no passphrase", sealed, Decryption{}, 8, "encrypted"},
		{"encrypted, wrong passphrase", sealed, Decryption{Passphrase: "wrong"}, 8, "cannot decrypt"},
		{"to a recipient, another identity", toKey, Decryption{Identities: other}, 8, "cannot decrypt"},
		{"to a recipient, no identity", toKey, Decryption{}, 8, "encrypted"},
		{"to a recipient, a passphrase", toKey, Decryption{Passphrase: "right"}, 8, "cannot decrypt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "restored")
			_, err := Restore(context.Background(), tc.file, tc.dec, dst, RestoreOptions{MaxSchema: tc.max})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Restore = %v, want an error saying %q", err, tc.want)
			}
			if _, err := os.Stat(dst); err == nil {
				t.Fatalf("a refused restore left %s behind", dst)
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), ".tether-restore-*")); len(left) > 0 {
				t.Fatalf("a refused restore left its staging folder: %v", left)
			}
		})
	}
}

func TestRestoreLeavesAnOccupiedDataDirAlone(t *testing.T) {
	good := create(t, source(dataDir(t), 8), Encryption{})
	for _, tc := range []struct {
		name  string
		files []string
		want  string
	}{
		{"another data dir", []string{"ca/ca.key"}, "not empty"},
		{"a live tetherd", []string{DatabaseName, DatabaseName + "-wal"}, "may be serving it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "live")
			for _, f := range tc.files {
				p := filepath.Join(dst, f)
				os.MkdirAll(filepath.Dir(p), 0o700)
				os.WriteFile(p, []byte("theirs"), 0o600)
			}
			_, err := Restore(context.Background(), good, Decryption{}, dst, RestoreOptions{MaxSchema: 8})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Restore = %v, want %q", err, tc.want)
			}
			for _, f := range tc.files {
				if b, _ := os.ReadFile(filepath.Join(dst, f)); string(b) != "theirs" {
					t.Fatalf("%s was overwritten: %q", f, b)
				}
			}
		})
	}
}

// A blob deleted between the walk of the data dir and its copy (a module
// deleted while the backup runs) is named in the manifest and the restore
// marker, and does not fail the backup.
func TestBlobDeletedDuringTheBackupIsNamed(t *testing.T) {
	dir := dataDir(t)
	src := source(dir, 8)
	skip := src.Skip
	src.Skip = func(rel string, d fs.DirEntry) bool {
		// The walk is in lexical order: blobs/ is listed by the time it
		// reaches server.key.
		if rel == "server.key" {
			os.Remove(filepath.Join(dir, "blobs", "sha256", "aa"))
		}
		return skip(rel, d)
	}
	out := create(t, src, Encryption{})
	dst := filepath.Join(t.TempDir(), "restored")
	m, err := Restore(context.Background(), out, Decryption{}, dst, RestoreOptions{MaxSchema: 8})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.MissingBlobs) != 1 || m.MissingBlobs[0] != "blobs/sha256/aa" {
		t.Fatalf("missing blobs %v, want the deleted one", m.MissingBlobs)
	}
	if mk, _, _ := ReadMarker(dst); len(mk.MissingBlobs) != 1 {
		t.Fatalf("the restore marker does not name the missing blob: %+v", mk)
	}
}

// A recipient that is not an age X25519 key is refused by name, before
// anything is written.
func TestCreateRefusesABadRecipient(t *testing.T) {
	for _, bad := range []string{"age1notakey", "ssh-ed25519 AAAA", ""} {
		t.Run(bad, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "b.tbk")
			_, err := Create(context.Background(), source(dataDir(t), 8), Encryption{Recipients: []string{bad}}, out)
			if err == nil || !strings.Contains(err.Error(), "recipient") || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
				t.Fatalf("Create with recipient %q = %v, want an error naming it", bad, err)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatal("a refused backup left a file")
			}
		})
	}
}
