package loader

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"sync"
)

// QuarantineFile is a quarantine.jsonl file that holds each rejected sample
// once, across restarts and re-plans that quarantine it again: opening it
// reads the keys (id, location, reason) already written, and Write drops a
// line whose key is known. A torn last line (a crash mid-write) is cut off
// on open. Use it as the io.Writer of NewQuarantineWriter (which writes one
// line per call). Safe for concurrent use.
type QuarantineFile struct {
	mu   sync.Mutex
	f    *os.File
	seed maphash.Seed
	seen map[uint64]bool
}

// OpenQuarantineFile opens (creating it when absent) the quarantine file at
// path for appending.
func OpenQuarantineFile(path string) (*QuarantineFile, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("loader: quarantine file: %w", err)
	}
	q := &QuarantineFile{f: f, seed: maphash.MakeSeed(), seen: map[uint64]bool{}}
	end, err := q.load()
	if err == nil {
		err = f.Truncate(end)
	}
	if err == nil {
		_, err = f.Seek(end, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("loader: quarantine file %s: %w", path, err)
	}
	return q, nil
}

// load reads the complete lines of the file into seen and returns the
// offset after the last complete line.
func (q *QuarantineFile) load() (int64, error) {
	br := bufio.NewReader(q.f)
	var end int64
	for {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return end, nil // a partial last line is dropped
		}
		if err != nil {
			return 0, err
		}
		end += int64(len(line))
		if k, ok := q.key(line); ok {
			q.seen[k] = true
		}
	}
}

func (q *QuarantineFile) key(line []byte) (uint64, bool) {
	var r Reject
	if len(bytes.TrimSpace(line)) == 0 || json.Unmarshal(line, &r) != nil {
		return 0, false
	}
	var h maphash.Hash
	h.SetSeed(q.seed)
	for _, s := range []string{r.ID, r.Location, r.Reason} {
		h.WriteString(s)
		h.WriteByte(0)
	}
	return h.Sum64(), true
}

// Write appends p, one JSON line, unless a line with the same id, location
// and reason is in the file already.
func (q *QuarantineFile) Write(p []byte) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	k, ok := q.key(p)
	if ok && q.seen[k] {
		return len(p), nil
	}
	n, err := q.f.Write(p)
	if err == nil && ok {
		q.seen[k] = true
	}
	return n, err
}

// Close closes the file.
func (q *QuarantineFile) Close() error { return q.f.Close() }
