package scalesim

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on
// every Linux this runs on).
const clockTicks = 100

// Proc is one process the harness started, its output in a log file.
type Proc struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	// killed marks a deliberate kill: its exit is no failure.
	killed atomic.Bool
}

// Start runs argv with its output in log.
func Start(name, log string, argv ...string) (*Proc, error) {
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("scalesim: start %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: log, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits up to d for the process to end and returns its exit error.
func (p *Proc) Wait(d time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		return fmt.Errorf("scalesim: %s still running after %v", p.Name, d)
	}
}

// Kill9 sends SIGKILL and waits for the end.
func (p *Proc) Kill9() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM, and SIGKILL after d.
func (p *Proc) Stop(d time.Duration) {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if p.Wait(d) != nil && !p.Exited() {
		p.Kill9()
	}
}

// Usage is a process's CPU time and memory at one moment.
type Usage struct {
	CPU     time.Duration // user + system
	RSS     int64         // resident bytes now
	PeakRSS int64         // the high-water mark (VmHWM)
}

// Usage reads the process's /proc entries; the zero Usage once it ended.
func (p *Proc) Usage() Usage {
	if p.Exited() {
		return Usage{}
	}
	return ReadUsage(p.Pid())
}

// ReadUsage reads pid's CPU time and RSS from /proc.
func ReadUsage(pid int) Usage {
	var u Usage
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// Fields after the command name, which is in parentheses.
		if i := bytes.LastIndexByte(b, ')'); i > 0 {
			f := strings.Fields(string(b[i+1:]))
			if len(f) > 13 {
				ut, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				u.CPU = time.Duration(ut+st) * time.Second / clockTicks
			}
		}
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "VmRSS:":
				u.RSS = kb << 10
			case "VmHWM:":
				u.PeakRSS = kb << 10
			}
		}
	}
	return u
}
