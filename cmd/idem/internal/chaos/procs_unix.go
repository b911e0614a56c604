//go:build unix

package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// supervisor starts the role processes, kills and restarts them, and reads what they print.
// Every child runs in a process group of its own, so a kill reaches anything it started, and
// every group is killed when the run ends, whatever the reason (see killAll and the command's
// context). A child also stops when its stdin (a pipe the harness holds) closes, and on Linux
// when the harness dies (Pdeathsig), so none outlives a harness that crashed.
type supervisor struct {
	ctx     context.Context
	exe     string
	prefix  []string
	verbose bool
	logf    func(format string, args ...any)
	// onStat receives every counter line of every child.
	onStat func(name, counter string, n int)

	mu    sync.Mutex
	procs map[string]*proc
	// restartOnExit makes the supervisor restart a child that exited on its own.
	restartOnExit bool
	// closed refuses new processes once killAll began.
	closed     bool
	unexpected int
	wg         sync.WaitGroup
}

// stderrTail is how many of a child's last log lines are kept to explain an unexpected exit
// when its logs are not forwarded.
const stderrTail = 20

// proc is one role process.
type proc struct {
	name, role string
	args       []string
	cmd        *exec.Cmd
	stdin      io.WriteCloser
	// done is closed once the process exited and its output is read.
	done chan struct{}
	// expected marks an exit the supervisor caused (kill, stop).
	expected bool
}

func newSupervisor(ctx context.Context, exe string, prefix []string, verbose bool, logf func(string, ...any), onStat func(name, counter string, n int)) *supervisor {
	return &supervisor{ctx: ctx, exe: exe, prefix: prefix, verbose: verbose, logf: logf, onStat: onStat, procs: map[string]*proc{}}
}

// start starts process name running role with args (replacing an exited process of that name).
func (s *supervisor) start(name, role string, args []string) error {
	argv := append(append([]string(nil), s.prefix...), args...)
	argv = append(argv, "--watch-stdin")
	if s.verbose {
		argv = append(argv, "--verbose")
	}
	cmd := exec.CommandContext(s.ctx, s.exe, argv...)
	cmd.SysProcAttr = sysProcAttr()
	cmd.Cancel = func() error { return killGroup(cmd) }
	cmd.WaitDelay = 5 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	p := &proc{name: name, role: role, args: args, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("chaos: not starting %s: the run is over", name)
	}
	if old := s.procs[name]; old != nil {
		select {
		case <-old.done:
		default:
			s.mu.Unlock()
			return fmt.Errorf("chaos: %s is still running", name)
		}
	}
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("chaos: start %s: %w", name, err)
	}
	s.procs[name] = p
	s.wg.Add(1)
	s.mu.Unlock()

	go func() {
		defer s.wg.Done()
		var readers sync.WaitGroup
		readers.Add(2)
		go func() {
			defer readers.Done()
			scanLines(stdout, func(line string) {
				if counter, n, ok := parseStat(line); ok {
					s.onStat(name, counter, n)
				} else if s.verbose {
					s.logf("[%s] %s", name, line)
				}
			})
		}()
		var tail []string // the last stderr lines, to explain an unexpected exit
		go func() {
			defer readers.Done()
			scanLines(stderr, func(line string) {
				if s.verbose {
					s.logf("[%s] %s", name, line)
					return
				}
				if len(tail) == stderrTail {
					tail = append(tail[:0], tail[1:]...)
				}
				tail = append(tail, line)
			})
		}()
		readers.Wait()
		err := cmd.Wait()
		s.mu.Lock()
		expected := p.expected
		restart := !expected && s.restartOnExit && s.ctx.Err() == nil
		if !expected && s.ctx.Err() == nil {
			s.unexpected++
		}
		s.mu.Unlock()
		// Explain before announcing the exit, so whoever waits on done sees the explanation.
		if !expected && s.ctx.Err() == nil {
			s.logf("%s exited on its own: %v", name, err)
			for _, line := range tail {
				s.logf("[%s] %s", name, line)
			}
		}
		close(p.done)
		if restart {
			time.Sleep(500 * time.Millisecond)
			if err := s.start(name, role, args); err != nil {
				s.logf("restart %s: %v", name, err)
			}
		}
	}()
	return nil
}

// get returns the process named name, or nil.
func (s *supervisor) get(name string) *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[name]
}

// running returns the names of the processes alive now.
func (s *supervisor) running() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for name, p := range s.procs {
		select {
		case <-p.done:
		default:
			if !p.expected {
				names = append(names, name)
			}
		}
	}
	return names
}

// kill sends SIGKILL to the process group of name and waits until the process is gone. It
// reports false when the process was not running.
func (s *supervisor) kill(name string) bool {
	p := s.take(name)
	if p == nil {
		return false
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return true
}

// stop asks the process to stop by closing its stdin, and kills its group after grace. A role
// watches its stdin (--watch-stdin) and stops gracefully at its end, which it sees however late
// it starts reading; a SIGTERM instead kills a process that has not installed its handler yet.
// So a producer restarted a moment before the drain still flushes the poison identities its
// killed predecessor committed but never published, where a SIGTERM left them unsent for good.
func (s *supervisor) stop(name string, grace time.Duration) bool {
	p := s.take(name)
	if p == nil {
		return false
	}
	_ = p.stdin.Close()
	select {
	case <-p.done:
		return true
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
	return true
}

// take marks the running process name as stopped by the supervisor (its exit is expected) and
// returns it, or nil when it is not running or already being stopped.
func (s *supervisor) take(name string) *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[name]
	if p == nil || p.expected {
		return nil
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	p.expected = true
	return p
}

// restart starts name again with the arguments it last ran with.
func (s *supervisor) restart(name string) error {
	p := s.get(name)
	if p == nil {
		return fmt.Errorf("chaos: no process %s", name)
	}
	<-p.done
	return s.start(name, p.role, p.args)
}

// setRestartOnExit turns the automatic restart of children that exit on their own on or off.
func (s *supervisor) setRestartOnExit(on bool) {
	s.mu.Lock()
	s.restartOnExit = on
	s.mu.Unlock()
}

// unexpectedExits counts children that exited without being killed or stopped.
func (s *supervisor) unexpectedExits() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unexpected
}

// killAll kills every process group still alive and waits for the supervisor's goroutines.
func (s *supervisor) killAll() {
	s.mu.Lock()
	s.closed, s.restartOnExit = true, false
	var alive []*proc
	for _, p := range s.procs {
		p.expected = true
		alive = append(alive, p)
	}
	s.mu.Unlock()
	for _, p := range alive {
		_ = killGroup(p.cmd)
		_ = p.stdin.Close()
	}
	s.wg.Wait()
}

// killGroup sends SIGKILL to the process group of cmd (its own group, see sysProcAttr).
func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}
