package qemu

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/providers"
)

// A restarted tetherd is not the parent of the VMs it finds running, so it
// cannot reap them and would learn of their death only from a dropped
// agent stream or the next provider sync. A pidfd is readable once its
// process exits, parent or not; put in the runtime's poller it costs a
// descriptor per VM and no thread.

// watchAdopted starts a watch on every live VM in the state dir that this
// driver did not launch. It is called once, when WatchExits is; a VM this
// driver launches later is its child and reaped as such.
func (r *realDriver) watchAdopted(ctx context.Context) {
	entries, err := os.ReadDir(r.cfg.StateDir)
	if err != nil {
		r.log.Warn("qemu: cannot look for running VMs to watch", "err", err)
		return
	}
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !validID.MatchString(id) || id == tpmDirName {
			continue
		}
		r.mu.Lock()
		_, child := r.procs[id]
		r.mu.Unlock()
		if child {
			continue
		}
		o, err := r.observe(id)
		if err != nil || !o.alive {
			continue
		}
		if err := r.watchPID(ctx, id, o.pid); err != nil {
			r.log.Warn("qemu: cannot watch a VM this tetherd did not start; its death is seen by the provider sync", "instance", id, "pid", o.pid, "err", err)
		}
	}
}

// watchPID reports the exit of pid, a VM of instance id that is not our
// child, unless by then this driver has launched the instance again.
func (r *realDriver) watchPID(ctx context.Context, id string, pid int) error {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))
	// The pid may have been reused between observe and the open: the
	// process the descriptor holds must still be the VM.
	if !processIsVM(pid, r.paths(id).qmpArg()) {
		f.Close()
		return nil
	}
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return fmt.Errorf("pidfd: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { f.Close() })
	go func() {
		defer stop()
		defer f.Close()
		exited := false
		err := raw.Read(func(fd uintptr) bool {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, _ := unix.Poll(p, 0)
			exited = n > 0
			return exited
		})
		if !exited || err != nil {
			return // ctx ended: the descriptor was closed under the wait
		}
		detail := fmt.Sprintf("qemu pid %d exited; this tetherd did not start it, so its exit status is unknown", pid)
		r.mu.Lock()
		_, relaunched := r.procs[id]
		if !relaunched {
			r.exits[id] = detail
		}
		notify := r.onExit
		r.mu.Unlock()
		if relaunched {
			return
		}
		r.log.Info("qemu exited", "instance", id, "pid", pid, "status", "unknown (not our child)")
		if notify != nil {
			notify(providers.Exit{MachineID: id, InstanceID: id, Detail: detail})
		}
	}()
	return nil
}
