package scalesim

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// NATS is a set of nats-server processes on loopback: one server, or a
// 3-server cluster with JetStream on each.
type NATS struct {
	bin, dir string
	ports    []int // client ports
	mon      []int // monitoring ports (/varz)
	procs    []*Proc
}

// NATSBinary finds nats-server: MMFEED_NATS_SERVER, PATH, build/nats-server
// under root (built there with go build when missing).
func NATSBinary(root string) (string, error) {
	if p := os.Getenv("MMFEED_NATS_SERVER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p, nil
	}
	out := filepath.Join(root, "build", "nats-server")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	cmd := exec.Command("go", "build", "-o", out, "github.com/nats-io/nats-server/v2")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("scalesim: build nats-server: %v: %s", err, b)
	}
	return out, nil
}

// StartNATS starts n (1 or 3) servers under dir.
func StartNATS(bin, dir string, n int) (*NATS, error) {
	ports, err := freePorts(3 * n)
	if err != nil {
		return nil, err
	}
	s := &NATS{bin: bin, dir: dir, ports: ports[:n], mon: ports[n : 2*n]}
	routes := ports[2*n:]
	for i := range n {
		conf := fmt.Sprintf("server_name: n%d\nlisten: \"127.0.0.1:%d\"\nhttp: \"127.0.0.1:%d\"\nmax_connections: 65536\n"+
			"jetstream { store_dir: %q }\n", i, s.ports[i], s.mon[i], filepath.Join(dir, fmt.Sprintf("js%d", i)))
		if n > 1 {
			var others []string
			for j := range n {
				if j != i {
					others = append(others, fmt.Sprintf("nats-route://127.0.0.1:%d", routes[j]))
				}
			}
			conf += fmt.Sprintf("cluster { name: scale, listen: \"127.0.0.1:%d\", routes: [%s] }\n", routes[i], strings.Join(others, ", "))
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("n%d.conf", i)), []byte(conf), 0o644); err != nil {
			return nil, err
		}
		s.procs = append(s.procs, nil)
		if err := s.start(i); err != nil {
			s.Stop()
			return nil, err
		}
	}
	return s, nil
}

func (s *NATS) start(i int) error {
	p, err := Start(fmt.Sprintf("nats-%d", i), filepath.Join(s.dir, fmt.Sprintf("n%d.log", i)),
		s.bin, "-c", filepath.Join(s.dir, fmt.Sprintf("n%d.conf", i)))
	if err != nil {
		return err
	}
	s.procs[i] = p
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if p.Exited() {
			return fmt.Errorf("scalesim: nats-server %d exited at start (log %s)", i, p.Log)
		}
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", s.ports[i])); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("scalesim: nats-server %d not listening after 20 s", i)
}

// URLs returns the client URLs.
func (s *NATS) URLs() []string {
	var out []string
	for _, p := range s.ports {
		out = append(out, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	return out
}

// Restart stops server i (SIGTERM) and starts it again on the same port and
// store.
func (s *NATS) Restart(i int) error {
	s.procs[i].Stop(10 * time.Second)
	return s.start(i)
}

// Usage sums the servers' CPU time and RSS (PeakRSS: the largest server's).
// A restarted server counts from its restart.
func (s *NATS) Usage() Usage {
	var u Usage
	for _, p := range s.procs {
		x := p.Usage()
		u.CPU += x.CPU
		u.RSS += x.RSS
		u.PeakRSS = max(u.PeakRSS, x.PeakRSS)
	}
	return u
}

// Varz is the part of a server's /varz the harness reads.
type Varz struct {
	InMsgs        int64 `json:"in_msgs"`
	OutMsgs       int64 `json:"out_msgs"`
	Connections   int   `json:"connections"`
	SlowConsumers int64 `json:"slow_consumers"`
	Subscriptions int64 `json:"subscriptions"`
}

// Varz sums every server's counters.
func (s *NATS) Varz() Varz {
	var v Varz
	for _, port := range s.mon {
		var x Varz
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/varz", port))
		if err != nil {
			continue
		}
		_ = json.NewDecoder(resp.Body).Decode(&x)
		resp.Body.Close()
		v.InMsgs += x.InMsgs
		v.OutMsgs += x.OutMsgs
		v.Connections += x.Connections
		v.SlowConsumers += x.SlowConsumers
		v.Subscriptions += x.Subscriptions
	}
	return v
}

// Stop stops every server.
func (s *NATS) Stop() {
	for _, p := range s.procs {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
}

// freePorts returns n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
