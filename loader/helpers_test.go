package loader

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// writeFile creates p (and its folders) with data.
func writeFile(t testing.TB, p string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// drained is what reading a whole source gave.
type drained struct {
	samples []Sample
	rejects []Reject
	stats   Stats
}

// drain opens path and reads every sample.
func drain(t testing.TB, path string, opts Options) drained {
	t.Helper()
	var d drained
	user := opts.OnReject
	opts.OnReject = func(r Reject) {
		d.rejects = append(d.rejects, r)
		if user != nil {
			user(r)
		}
	}
	src, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	defer src.Close()
	for {
		s, err := src.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		d.samples = append(d.samples, s)
	}
	d.stats = src.Stats()
	checkInvariant(t, d.stats, len(d.samples), len(d.rejects))
	return d
}

// checkInvariant checks Seen == Emitted + Quarantined and the counts match
// what the caller observed.
func checkInvariant(t testing.TB, s Stats, emitted, rejected int) {
	t.Helper()
	var sum int64
	for _, n := range s.ByReason {
		sum += n
	}
	if s.Seen != s.Emitted+s.Quarantined || s.Emitted != int64(emitted) ||
		s.Quarantined != int64(rejected) || sum != s.Quarantined {
		t.Errorf("stats %+v: want seen = emitted (%d) + quarantined (%d), by-reason sum %d", s, emitted, rejected, sum)
	}
}

// reasonsByLoc maps reject location → reason.
func reasonsByLoc(rs []Reject) map[string]string {
	m := map[string]string{}
	for _, r := range rs {
		m[r.Location] = r.Reason
	}
	return m
}

func ids(ss []Sample) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.ID
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
