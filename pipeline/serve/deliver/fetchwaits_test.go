package deliver

import (
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// FetchWaits keeps one waiter per batch: a later fetch joins it (the newest
// reply, the wait counted from the newest fetch), a claim or an expiry ends
// it, and a fetch after that starts a new one.
func TestFetchWaitsJoin(t *testing.T) {
	f := NewFetchWaits()
	k := proto.BatchKey{Job: "job-1", Step: 3}
	t0 := time.Now()
	w := f.Join(k, "a", t0)
	if w == nil || f.Join(k, "b", t0.Add(time.Minute)) != nil {
		t.Fatal("the second fetch of a batch did not join the first")
	}
	if d := f.Left(k, w, t0.Add(FetchWait)); d != time.Minute {
		t.Errorf("left %v at the first fetch's deadline, want the minute the second added", d)
	}
	if reply := f.Claim(k, w); reply != "b" {
		t.Errorf("claim answers %q, want the newest reply b", reply)
	}
	w2 := f.Join(k, "c", t0)
	if w2 == nil || w2 == w {
		t.Fatal("a fetch after the claim did not start a new wait")
	}
	if d := f.Left(k, w2, t0.Add(FetchWait)); d != 0 {
		t.Errorf("left %v after the deadline, want 0", d)
	}
	if f.Join(k, "d", t0) == nil {
		t.Error("a fetch after an expired wait joined it")
	}
}
