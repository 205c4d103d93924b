package scalesim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	if err := s.waitJetStream(30 * time.Second); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitJetStream waits until every server answers a JetStream account info
// (a cluster has elected its meta leader).
func (s *NATS) waitJetStream(d time.Duration) error {
	deadline := time.Now().Add(d)
	for i, url := range s.URLs() {
		for {
			err := jetStreamReady(url)
			if err == nil && len(s.ports) > 1 && i == 0 {
				err = s.metaFormed()
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("scalesim: JetStream on %s not ready after %v: %w", url, d, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// metaFormed reports whether every server sees the same meta leader in a
// cluster of all of them and the leader sees every other server as a
// current peer (placement with replicas 3 needs them all).
func (s *NATS) metaFormed() error {
	leader := ""
	for i, port := range s.mon {
		var jsz struct {
			Meta struct {
				Leader   string `json:"leader"`
				Size     int    `json:"cluster_size"`
				Replicas []struct {
					Current bool `json:"current"`
				} `json:"replicas"`
			} `json:"meta_cluster"`
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/jsz", port))
		if err != nil {
			return err
		}
		err = json.NewDecoder(resp.Body).Decode(&jsz)
		resp.Body.Close()
		if err != nil {
			return err
		}
		m := jsz.Meta
		if m.Leader == "" || (leader != "" && m.Leader != leader) || m.Size != len(s.ports) {
			return fmt.Errorf("server n%d: meta leader %q, cluster size %d", i, m.Leader, m.Size)
		}
		leader = m.Leader
		if m.Leader == fmt.Sprintf("n%d", i) {
			for _, r := range m.Replicas {
				if !r.Current {
					return fmt.Errorf("server n%d: a peer is not current", i)
				}
			}
		}
	}
	return nil
}

func jetStreamReady(url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
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
