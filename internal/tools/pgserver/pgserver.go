// Package pgserver runs a throwaway PostgreSQL server: initdb into a temp
// dir, a unix socket in that dir, no TCP. As root, the server runs as the
// postgres user (initdb refuses root). Tests reach it through pgtest,
// which shares one server per test binary; `tether-bench chaos` starts
// one itself. It links no testing code, so a shipped tool may use it.
package pgserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// BinEnv names a directory holding initdb, pg_ctl and postgres; it
// overrides the search of /usr/lib/postgresql/*/bin and $PATH.
const BinEnv = "TETHER_PG_BIN"

// ErrNoBinaries means no PostgreSQL server binaries were found; tests skip
// on it (and only on it).
var ErrNoBinaries = errors.New("pgserver: PostgreSQL server binaries not found")

// FindBin returns the directory holding the server binaries. The error
// names every place it looked, so a skipped test says what to install.
func FindBin() (string, error) {
	var tried []string
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
			p := filepath.Join(dir, b)
			if _, err := os.Stat(p); err != nil {
				tried = append(tried, p)
				return false
			}
		}
		return true
	}
	if dir := os.Getenv(BinEnv); dir != "" {
		if has(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("%w: $%s=%s lacks %s", ErrNoBinaries, BinEnv, dir, strings.Join(tried, ", "))
	}
	// Debian/Ubuntu keep the server outside $PATH, one directory per major
	// version; take the newest.
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) > majorOf(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	if len(tried) == 0 {
		tried = append(tried, "/usr/lib/postgresql/15/bin/initdb")
	}
	return "", fmt.Errorf("%w: missing %s (and no initdb on $PATH); install postgresql (e.g. apt-get install postgresql) or set $%s",
		ErrNoBinaries, strings.Join(tried, ", "), BinEnv)
}

func majorOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// Options tune a server.
type Options struct {
	// Durable keeps fsync on (benchmarks). Tests run with fsync off.
	Durable bool
	// MaxConnections defaults to 400: two replicas with full pools, the
	// 64-claimer races and their listener and lock connections fit.
	MaxConnections int
}

// Server is one throwaway cluster.
type Server struct {
	// Bin is the directory of the server binaries.
	Bin string
	// Dir holds data/, the socket and server.log.
	Dir string

	opts  Options
	runAs *user.User // nil: run as the current user

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	running bool
}

// NewServer initialises a cluster in a new temp dir and starts it.
func NewServer(opts Options) (*Server, error) {
	bin, err := FindBin()
	if err != nil {
		return nil, err
	}
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 400
	}
	s := &Server{Bin: bin, opts: opts}
	if os.Geteuid() == 0 {
		if s.runAs, err = user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("pgserver: running as root, so the server must run as the postgres user: %w", err)
		}
	}
	// A unix socket path must stay under ~100 bytes, and every parent of
	// the dir must be traversable by the server's user: /tmp is both,
	// while a deep $TMPDIR or t.TempDir() (mode 0700) may be neither.
	base := os.TempDir()
	if len(base) > 60 {
		base = "/tmp"
	}
	if s.Dir, err = os.MkdirTemp(base, "pgtest-"); err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	if err := os.Chmod(s.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	if s.runAs != nil {
		uid, _ := strconv.Atoi(s.runAs.Uid)
		gid, _ := strconv.Atoi(s.runAs.Gid)
		if err := os.Chown(s.Dir, uid, gid); err != nil {
			return nil, fmt.Errorf("pgserver: chown %s to postgres: %w", s.Dir, err)
		}
	}
	out, err := s.command(filepath.Join(bin, "initdb"), "-D", s.dataDir(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--no-locale", "--no-sync").CombinedOutput()
	if err != nil {
		os.RemoveAll(s.Dir)
		return nil, fmt.Errorf("pgserver: initdb: %w\n%s", err, out)
	}
	if err := s.Start(); err != nil {
		os.RemoveAll(s.Dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) dataDir() string { return filepath.Join(s.Dir, "data") }

// LogFile is the server's log (stderr of postgres).
func (s *Server) LogFile() string { return filepath.Join(s.Dir, "server.log") }

// command runs name as the server's user: through runuser when we are
// root, since initdb and postgres refuse to run as root.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	if s.runAs == nil {
		return exec.Command(name, args...)
	}
	return exec.Command("runuser", append([]string{"-u", s.runAs.Username, "--", name}, args...)...)
}

// Start starts the server (after Stop) and waits until it accepts
// connections.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		return nil
	}
	args := []string{"-D", s.dataDir(), "-k", s.Dir, "-c", "listen_addresses=",
		"-c", "max_connections=" + strconv.Itoa(s.opts.MaxConnections)}
	if !s.opts.Durable {
		args = append(args, "-F", "-c", "full_page_writes=off", "-c", "synchronous_commit=off")
	}
	logf, err := os.OpenFile(s.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	cmd := s.command(filepath.Join(s.Bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies, the server goes with it (runuser forwards
	// the signal) instead of lingering on a deleted temp dir.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("pgserver: start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	s.cmd, s.exited = cmd, exited

	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			s.running = true
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("pgserver: postgres exited during start-up:\n%s", s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("pgserver: postgres not ready within 60s (last error: %v):\n%s", err, s.logTail())
		}
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.LogFile())
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// Stop shuts the server down in "fast" mode: open sessions are terminated
// (they see SQLSTATE 57P01), as in an operator's restart.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return nil
	}
	s.running = false
	out, err := s.command(filepath.Join(s.Bin, "pg_ctl"), "-D", s.dataDir(), "-m", "fast", "-w", "-t", "60", "stop").CombinedOutput()
	if err != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("pgserver: pg_ctl stop: %w\n%s", err, out)
	}
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	return nil
}

// Restart stops and starts the server.
func (s *Server) Restart() error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.Start()
}

// Close stops the server and removes its dir.
func (s *Server) Close() error {
	err := s.Stop()
	if rmErr := os.RemoveAll(s.Dir); err == nil {
		err = rmErr
	}
	return err
}

// DSN is a URL for database db over the unix socket.
func (s *Server) DSN(db string) string {
	return "postgres://postgres@/" + db + "?host=" + s.Dir + "&sslmode=disable"
}

// CreateDatabase creates a database with a random name t_<hex> and
// returns its DSN.
func (s *Server) CreateDatabase(ctx context.Context) (name, dsn string, err error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	name = "t_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return "", "", fmt.Errorf("pgserver: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", "", fmt.Errorf("pgserver: create database: %w", err)
	}
	return name, s.DSN(name), nil
}

// DropDatabase drops a database, disconnecting its sessions.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgserver: drop database %s: %w", name, err)
	}
	return nil
}
