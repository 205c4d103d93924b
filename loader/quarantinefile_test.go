package loader

import (
	"os"
	"path/filepath"
	"testing"
)

// TestQuarantineFileOnce: a restart (or re-plan) that quarantines the same
// samples again leaves one line per sample; a torn last line is cut off.
func TestQuarantineFileOnce(t *testing.T) {
	p := filepath.Join(t.TempDir(), "quarantine-e0.jsonl")
	a := Reject{ID: "a", Location: "m.jsonl:1", Reason: ReasonEmptyImage, Detail: "zero-byte image"}
	b := Reject{ID: "b", Location: "m.jsonl:2", Reason: ReasonTooLarge, Detail: "first run"}
	run := func(rs ...Reject) {
		f, err := OpenQuarantineFile(p)
		must(t, err)
		q := NewQuarantineWriter(f)
		for _, r := range rs {
			must(t, q.Write(r))
		}
		must(t, f.Close())
	}
	run(a, b, a)
	data, err := os.ReadFile(p)
	must(t, err)
	must(t, os.WriteFile(p, append(data, `{"id":"torn","loc`...), 0o644))
	b.Detail = "second run: details may differ"
	run(b, a, Reject{ID: "c", Location: "m.jsonl:3", Reason: ReasonMissingImage, Detail: "x"})
	f, err := os.Open(p)
	must(t, err)
	defer f.Close()
	got, err := ReadQuarantine(f)
	must(t, err)
	var ids []string
	for _, r := range got {
		ids = append(ids, r.ID)
	}
	if len(ids) != 3 || ids[0] != "a" || ids[1] != "b" || ids[2] != "c" {
		t.Errorf("got lines for %v, want [a b c]", ids)
	}
}
