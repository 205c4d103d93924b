package deliver

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
)

// memStore is a job's KV bucket in memory (Store) that counts its writes.
type memStore struct {
	mu     sync.Mutex
	vals   map[string][]byte
	steps  map[[2]int][2]int // rank.<dp>.<mp>.step of an earlier service: (epoch, step)
	writes int
}

func newMemStore() *memStore {
	return &memStore{vals: map[string][]byte{}, steps: map[[2]int][2]int{}}
}

func (m *memStore) put(key string, b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.vals[key] = b
	m.writes++
}

func (m *memStore) get(key string) ([]byte, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.vals[key]
	return b, ok
}

func (m *memStore) PutJSON(_ context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err == nil {
		m.put(key, b)
	}
	return err
}

func (m *memStore) GetJSON(_ context.Context, key string, v any) (bool, error) {
	b, ok := m.get(key)
	if !ok {
		return false, nil
	}
	return true, json.Unmarshal(b, v)
}

func (m *memStore) PutInt(_ context.Context, key string, v int) error {
	m.put(key, []byte(strconv.Itoa(v)))
	return nil
}

func (m *memStore) GetInt(_ context.Context, key string) (int, bool, error) {
	b, ok := m.get(key)
	if !ok {
		return 0, false, nil
	}
	v, err := strconv.Atoi(string(b))
	return v, err == nil, err
}

func (m *memStore) RankStep(_ context.Context, dp, mp int) (epoch, step int, ok bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.steps[[2]int{dp, mp}]
	return s[0], s[1], ok, nil
}

func (m *memStore) Bucket() bool { return true }

// delete removes key, as an earlier service's bucket never had it.
func (m *memStore) delete(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.vals, key)
}

// putRankStep writes rank (dp, mp)'s rank.<dp>.<mp>.step, as an earlier
// service did.
func (m *memStore) putRankStep(dp, mp, epoch, step int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.steps[[2]int{dp, mp}] = [2]int{epoch, step}
}

// writeCount is the number of writes so far.
func (m *memStore) writeCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writes
}
