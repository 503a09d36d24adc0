package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/controlplane/backup"
	"github.com/tetherfleet/tether/controlplane/daemon"
)

func backupCmd() *cobra.Command {
	var o daemon.BackupOptions
	var passFile, output string
	cmd := &cobra.Command{
		Use:   "backup --data-dir DIR --out FILE",
		Short: "Write a consistent backup of a data dir while tetherd serves it (keys, database snapshot, module blobs)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			pass, err := readSecret(passFile)
			if err != nil {
				return err
			}
			o.Encryption.Passphrase = pass
			if o.Store == "" {
				o.Store = os.Getenv("TETHER_STORE")
			}
			o.Progress = progress(cmd.ErrOrStderr(), "backup")
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			m, err := daemon.Backup(ctx, o)
			if err != nil {
				return err
			}
			if output == "json" {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(summary(m, o.Out))
			}
			what := fmt.Sprintf("database schema %d", m.SchemaVersion)
			if m.KeysOnly {
				what = "keys and certificates only"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d files, %s, %s, CA %s, taken at %s\n", o.Out, len(m.Files), mib(m.Bytes()), what,
				m.CAFingerprint, m.Created.Format(time.RFC3339))
			if len(m.MissingBlobs) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "note: %d module blobs were deleted while the backup ran and are not in it\n", len(m.MissingBlobs))
			}
			if o.Encryption.Passphrase == "" && len(o.Encryption.Recipients) == 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "the backup holds the CA key in the clear: keep %s where only you can read it, or use --passphrase-file or --recipient\n", o.Out)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", "", "the data dir to back up (required)")
	f.StringVar(&o.Out, "out", "", "the backup file to write; it must not exist (required)")
	f.StringVar(&o.Store, "store", "", "the data dir's store, as given to serve (env TETHER_STORE); a PostgreSQL store takes --keys-only")
	f.BoolVar(&o.KeysOnly, "keys-only", false, "leave out the database and the module blobs (for a PostgreSQL store, whose database pg_dump backs up)")
	f.StringVar(&passFile, "passphrase-file", "", "encrypt the backup (age, scrypt) with the passphrase in this file's first line")
	f.StringSliceVar(&o.Encryption.Recipients, "recipient", nil, "encrypt the backup to this age recipient (age1...); repeatable")
	f.StringVarP(&output, "output", "o", "text", "text or json")
	_ = cmd.MarkFlagRequired("data-dir")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

func restoreCmd() *cobra.Command {
	var in, dataDir, passFile, identityFile, output string
	cmd := &cobra.Command{
		Use:   "restore --in FILE --data-dir DIR",
		Short: "Rebuild a data dir from a backup (the folder must be new or empty)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			var dec backup.Decryption
			var err error
			if dec.Passphrase, err = readSecret(passFile); err != nil {
				return err
			}
			if identityFile != "" {
				b, err := os.ReadFile(identityFile)
				if err != nil {
					return fmt.Errorf("--identity: %w", err)
				}
				dec.Identities = string(b)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			m, err := daemon.Restore(ctx, in, dataDir, dec, progress(cmd.ErrOrStderr(), "restore"))
			if err != nil {
				return err
			}
			if output == "json" {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(summary(m, in))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored %s into %s: %d files, %s, CA %s, taken at %s\n", in, dataDir, len(m.Files), mib(m.Bytes()),
				m.CAFingerprint, m.Created.Format(time.RFC3339))
			if m.KeysOnly {
				fmt.Fprintf(cmd.OutOrStdout(), "  the backup holds no database: restore it with PostgreSQL's tools, then serve with --store\n")
			}
			fmt.Fprintf(cmd.OutOrStdout(), "  next: tetherd serve --data-dir %s (its first start records what was written after the backup as lost)\n", dataDir)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&in, "in", "", "the backup file (required)")
	f.StringVar(&dataDir, "data-dir", "", "the data dir to create; it must not exist or be empty (required)")
	f.StringVar(&passFile, "passphrase-file", "", "the passphrase of an encrypted backup, in this file's first line")
	f.StringVar(&identityFile, "identity", "", "an age identity file that opens an encrypted backup")
	f.StringVarP(&output, "output", "o", "text", "text or json")
	_ = cmd.MarkFlagRequired("in")
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}

func checkOutput(o string) error {
	if o != "text" && o != "json" {
		return fmt.Errorf("-o %q: want text or json", o)
	}
	return nil
}

// readSecret reads the first line of a file; "" for no file. The secret
// never goes on the command line, where ps shows it to every local user.
func readSecret(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--passphrase-file: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimRight(line, "\r")
	if line == "" {
		return "", fmt.Errorf("--passphrase-file %s: the first line is empty", path)
	}
	return line, nil
}

// progress reports a long backup or restore at most once a second.
func progress(w io.Writer, verb string) func(done, total int64, name string) {
	var last time.Time
	return func(done, total int64, name string) {
		if now := time.Now(); now.Sub(last) >= time.Second || done == total {
			last = now
			pct := 100.0
			if total > 0 {
				pct = 100 * float64(done) / float64(total)
			}
			fmt.Fprintf(w, "%s: %3.0f%% (%s of %s) %s\n", verb, pct, mib(done), mib(total), name)
		}
	}
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

type backupSummary struct {
	File          string    `json:"file"`
	Created       time.Time `json:"created_at"`
	Store         string    `json:"store"`
	KeysOnly      bool      `json:"keys_only"`
	SchemaVersion int       `json:"schema_version"`
	CAFingerprint string    `json:"ca_fingerprint"`
	Files         int       `json:"files"`
	Bytes         int64     `json:"bytes"`
	MissingBlobs  []string  `json:"missing_blobs,omitempty"`
}

func summary(m backup.Manifest, file string) backupSummary {
	return backupSummary{File: file, Created: m.Created, Store: m.Store, KeysOnly: m.KeysOnly, SchemaVersion: m.SchemaVersion,
		CAFingerprint: m.CAFingerprint, Files: len(m.Files), Bytes: m.Bytes(), MissingBlobs: m.MissingBlobs}
}
