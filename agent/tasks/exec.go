package tasks

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/agent/session"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// exec runs argv in its own process group, so a timeout or a cancel kills
// everything it started, not just the first process. stdout and stderr
// are interleaved into one output capped at maxOutput bytes.
func (e *Executor) exec(ctx context.Context, p *tetherv1.ExecPayload, maxOutput int) session.Outcome {
	argv := p.GetArgv()
	if len(argv) == 0 || argv[0] == "" {
		return session.Outcome{Err: errors.New("exec: empty argv")}
	}
	timeout := DefaultExecTimeout
	if s := p.GetTimeoutSeconds(); s > 0 {
		timeout = time.Duration(s) * time.Second
	}
	if maxOutput <= 0 {
		maxOutput = session.DefaultMaxTaskOutputBytes
	}
	after := e.After
	if after == nil {
		after = time.After
	}
	killWait := e.KillWait
	if killWait == 0 {
		killWait = 2 * time.Second
	}

	out := &capWriter{max: maxOutput}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A grandchild that escaped the kill could hold the output pipe open
	// forever; stop waiting for it after a while.
	cmd.WaitDelay = killWait
	if err := e.Procs.start(cmd); err != nil {
		return session.Outcome{Err: fmt.Errorf("exec %s: %w", quoteArgv(argv), err), Result: &tetherv1.TaskResult{ExitCode: -1}}
	}
	pid := cmd.Process.Pid
	waited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		e.Procs.release(pid)
		waited <- err
	}()

	var why error
	var err error
	select {
	case err = <-waited:
	case <-ctx.Done():
		why = fmt.Errorf("exec %s: %w; killed its process group", quoteArgv(argv), context.Cause(ctx))
	case <-after(timeout):
		why = fmt.Errorf("exec %s: timed out after %s; killed its process group (raise the task's timeout if it needs longer)", quoteArgv(argv), timeout)
	}
	if why != nil {
		_ = unix.Kill(-pid, unix.SIGKILL)
		err = <-waited
	}
	res := &tetherv1.TaskResult{ExitCode: int32(cmd.ProcessState.ExitCode()), Output: out.buf, OutputTruncated: out.truncated}
	switch {
	case why != nil:
		return session.Outcome{Result: res, Err: why}
	case err != nil:
		return session.Outcome{Result: res, Err: fmt.Errorf("exec %s: %w", quoteArgv(argv), err)}
	}
	return session.Outcome{Result: res}
}
