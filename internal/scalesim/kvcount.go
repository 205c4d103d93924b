package scalesim

import (
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// kvCounter counts the writes to a job's KV bucket by key kind, from a
// plain subscription to the bucket's subjects ($KV.mmfeed_<job>.>: every
// put, delete and purge is a message there).
type kvCounter struct {
	nc *nats.Conn
	mu sync.Mutex
	n  map[string]int
}

func countKV(urls []string, job string) (*kvCounter, error) {
	nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	c := &kvCounter{nc: nc, n: map[string]int{}}
	prefix := "$KV.mmfeed_" + job + "."
	sub, err := nc.Subscribe(prefix+">", func(m *nats.Msg) {
		k := kvKind(strings.TrimPrefix(m.Subject, prefix))
		c.mu.Lock()
		c.n[k]++
		c.mu.Unlock()
	})
	if err == nil {
		_ = sub.SetPendingLimits(-1, -1)
		err = nc.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// kvKind names a key's kind: rank.<dp>.<mp>.<x> is x (step, gen, handed),
// any other key its first dot-separated part (config, epoch, ...).
func kvKind(key string) string {
	parts := strings.Split(key, ".")
	if parts[0] == "rank" && len(parts) == 4 {
		return parts[3]
	}
	return parts[0]
}

func (c *kvCounter) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

func (c *kvCounter) close() { c.nc.Close() }
