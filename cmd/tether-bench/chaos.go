package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tetherfleet/tether/internal/tools/chaos"
	"github.com/tetherfleet/tether/internal/tools/pgserver"
)

// chaosCmd is `make chaos`: kill -9 a real tetherd under load (on
// PostgreSQL, one of two replicas at a time) and check the invariants
// afterwards. It exits non-zero when one is broken.
func chaosCmd(args []string) error {
	fs := flag.NewFlagSet("chaos", flag.ExitOnError)
	var cfg chaos.Config
	fs.StringVar(&cfg.Tetherd, "tetherd", "bin/tetherd", "tetherd binary to run (a separate process, so kill -9 is real)")
	fs.StringVar(&cfg.WorkDir, "dir", "", "work directory (default: a new temporary directory, kept for its logs)")
	fs.DurationVar(&cfg.Duration, "duration", 2*time.Minute, "how long load and faults run")
	store := fs.String("store", "sqlite", "sqlite (one tetherd) or postgres (a throwaway PostgreSQL server and two tetherd replicas on it)")
	fs.IntVar(&cfg.Instances, "instances", 150, "non-pooled fake instances to provision (each one a simulated agent)")
	fs.IntVar(&cfg.Pools, "pools", 4, "pools backed by the fake provider")
	fs.IntVar(&cfg.PoolSize, "pool-size", 12, "target size of each pool")
	fs.IntVar(&cfg.Claimers, "claimers", 32, "concurrent claim/release loops")
	fs.DurationVar(&cfg.KillMin, "kill-min", 5*time.Second, "shortest wait between two kill -9s")
	fs.DurationVar(&cfg.KillMax, "kill-max", 20*time.Second, "longest wait between two kill -9s")
	fs.DurationVar(&cfg.DownMax, "down-max", 3*time.Second, "with replicas (postgres), how long a killed replica may stay down before its restart, the other serving")
	fs.BoolVar(&cfg.Backup, "backup", false, "SQLite: take a tetherd backup half-way through the load, and after the run restore it into a new data dir served on another port; claims acknowledged before it, the restored event and the agents' certificates are checked")
	fs.StringVar(&cfg.OldTetherd, "old-tetherd", "", "with --store postgres: replica 0 runs this older tetherd, started before replica 1 migrates the database past it (a rolling upgrade's middle); nothing is killed, and any unexpected call error or logged error breaks an invariant")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Out = os.Stdout
	if cfg.WorkDir == "" {
		d, err := os.MkdirTemp("", "tether-chaos-")
		if err != nil {
			return err
		}
		cfg.WorkDir = d
	} else if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	fmt.Printf("chaos: work dir %s (tetherd.log, or tetherd-0.log and tetherd-1.log for replicas, are there)\n", cfg.WorkDir)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if cfg.OldTetherd != "" && *store != "postgres" {
		return fmt.Errorf("--old-tetherd needs --store postgres: an old and a new build share one database only there")
	}
	switch *store {
	case "sqlite":
	case "postgres":
		srv, err := pgserver.NewServer(pgserver.Options{})
		if err != nil {
			return fmt.Errorf("start PostgreSQL: %w", err)
		}
		defer srv.Close()
		_, dsn, err := srv.CreateDatabase(ctx)
		if err != nil {
			return fmt.Errorf("create the chaos database: %w", err)
		}
		cfg.Store = dsn
		cfg.RestartStore = srv.Restart
	default:
		return fmt.Errorf("--store %q: want sqlite or postgres", *store)
	}
	res, err := chaos.Run(ctx, cfg)
	if err != nil {
		return err
	}
	broken := 0
	for _, r := range res {
		if !r.OK() {
			broken++
		}
	}
	if broken > 0 {
		return fmt.Errorf("%d invariants broken", broken)
	}
	fmt.Println("chaos: every invariant held")
	return nil
}
