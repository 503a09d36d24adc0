package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// The data dir holds the CA key, the BMC credentials key and the database:
// only tetherd's user may enter it, whatever the umask or the mode a
// directory made beforehand had (`mkdir -m755 D; tetherd init --data-dir D`).

// makePrivateDir creates dir 0700, or tightens an existing one to 0700.
// A directory that cannot be tightened (another user's) is refused.
func makePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("data dir %s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o077 == 0 {
		return nil
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("data dir %s has mode %04o, readable by other users, and cannot be made 0700: %w", dir, fi.Mode().Perm(), err)
	}
	return nil
}

// privateSQLite makes the data dir 0700 and the SQLite database and its
// journals 0600 before the driver opens them. SQLite gives the WAL and
// shared-memory files the database file's mode, so a database created
// 0600 here keeps them private too.
func privateSQLite(dataDir, path string) error {
	if err := makePrivateDir(dataDir); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(p, 0o600); err != nil {
				return fmt.Errorf("%s has mode %04o, readable by other users, and cannot be made 0600: %w", filepath.Base(p), fi.Mode().Perm(), err)
			}
		}
	}
	return nil
}
