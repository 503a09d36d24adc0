// Command mkinitramfs builds the netboot initramfs (see package initramfs).
//
//	mkinitramfs -agent bin/tether-agent -kernel .cache/kernel -o build/initramfs.cpio
//
// It prints the output's path, size and sha256.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"

	"github.com/u-root/uio/llog"

	"github.com/tetherfleet/tether/initramfs"
)

func main() {
	var (
		opts    initramfs.Options
		modules = strings.Join(initramfs.DefaultModules, ",")
		skip    = strings.Join(initramfs.DefaultSkip, ",")
		verbose bool
	)
	flag.StringVar(&opts.Agent, "agent", "", "static agent binary to install as /init (required)")
	flag.StringVar(&opts.KernelDir, "kernel", ".cache/kernel", "kernel cache from scripts/fetch-kernel.sh")
	flag.StringVar(&opts.Output, "o", "build/initramfs.cpio", "output cpio")
	flag.StringVar(&opts.Busybox, "busybox", "auto", `static busybox for the debug shell: a path, "auto" (busybox on PATH) or "none"`)
	flag.StringVar(&modules, "modules", modules, "kernel modules to ship (their dependencies are added)")
	flag.StringVar(&skip, "skip", skip, "modules never to ship")
	flag.BoolVar(&verbose, "v", false, "show mkuimage's messages")
	var signers string
	flag.StringVar(&signers, "signers", "", "signer public key files to bake in as the node's signer anchor (comma-separated)")
	flag.Parse()
	if opts.Agent == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	switch opts.Busybox {
	case "none":
		opts.Busybox = ""
	case "auto":
		p, err := exec.LookPath("busybox")
		if err != nil {
			fmt.Fprintln(os.Stderr, `mkinitramfs: no busybox on PATH (apt-get install busybox-static), or pass -busybox=none`)
			os.Exit(1)
		}
		opts.Busybox = p
	}
	opts.Modules = splitList(modules)
	opts.Skip = splitList(skip)
	if signers != "" {
		opts.Signers = splitList(signers)
	}
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelInfo
	}
	opts.Logger = llog.New(level, llog.WritePrintf(os.Stderr))

	res, err := initramfs.Build(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkinitramfs:", err)
		os.Exit(1)
	}
	fmt.Printf("%s %d sha256:%s\n", res.Path, res.Size, res.SHA256)
	fmt.Fprintf(os.Stderr, "mkinitramfs: kernel %s, %d modules, order file %s\n", res.Release, len(res.Order), res.OrderFile)
}

func splitList(s string) []string {
	out := []string{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
