package deliver

import (
	"context"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/epochs"
	"github.com/mmfeed/mmfeed/proto"
)

// TestPositionsShareWrites: the positions of many ranks stepping at once go
// to the KV bucket in a few writes (not one per rank and step), the record
// holds every rank's last completed step once the writer ran, a restarted
// table starts each rank after it, and a bucket of an earlier service, with
// only the per-rank keys (rank.<dp>.<mp>.step), is read too.
func TestPositionsShareWrites(t *testing.T) {
	const n, steps = 256, 5
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := newMemStore()
	book := epochs.NewBook(nil, nil)
	book.SetInfo(0, epochs.Info{Epoch: 0, Steps: steps})
	tab := NewRanks(n, 2, book, st)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); tab.RunPositions(wctx, 20*time.Millisecond) }()
	for step := 1; step <= steps; step++ {
		for r := range n {
			tab.SetNext(r, proto.Pos{Epoch: 0, Step: step}, false)
		}
		time.Sleep(5 * time.Millisecond) // a step's acks arrive together
	}
	stop()
	<-done
	if err := tab.FlushPositions(ctx); err != nil {
		t.Fatal(err)
	}
	writes := st.writeCount()
	t.Logf("%d KV writes for %d ranks × %d steps", writes, n, steps)
	if writes == 0 || writes > 2*steps {
		t.Errorf("%d KV writes for %d ranks × %d steps, want 1..%d", writes, n, steps, 2*steps)
	}
	if err := tab.FlushPositions(ctx); err != nil || st.writeCount() != writes {
		t.Errorf("a flush with nothing new wrote again (err %v)", err)
	}
	again := NewRanks(n, 2, book, st)
	for r := range n {
		rs, err := again.Load(ctx, r, proto.Pos{})
		if err != nil {
			t.Fatal(err)
		}
		if rs.next != (proto.Pos{Epoch: 1, Step: 0}) || rs.cursor != rs.next {
			t.Errorf("rank %d after a restart: next %v cursor %v, want epoch 1 step 0", r, rs.next, rs.cursor)
		}
	}

	// A register moves a rank back, to the job's first step: recorded as none.
	again.SetNext(5, proto.Pos{Epoch: 0, Step: 0}, true)
	if err := again.FlushPositions(ctx); err != nil {
		t.Fatal(err)
	}
	var rec RanksRecord
	if ok, err := st.GetJSON(ctx, KeyPositions, &rec); err != nil || !ok || rec.Ranks[5] != nil || *rec.Ranks[4] != (KVStep{0, steps - 1}) {
		t.Errorf("record after rank 5 registered at the first step: %v %v (ok %v, err %v)", rec.Ranks[5], rec.Ranks[4], ok, err)
	}

	// An earlier service's bucket: rank.<dp>.<mp>.step only.
	st.delete(KeyPositions)
	st.putRankStep(1, 1, 0, 2)
	old := NewRanks(n, 2, book, st)
	for _, tt := range []struct {
		r    int
		want proto.Pos
	}{{3, proto.Pos{Epoch: 0, Step: 3}}, {4, proto.Pos{}}} {
		rs, err := old.Load(ctx, tt.r, proto.Pos{})
		if err != nil {
			t.Fatal(err)
		}
		if rs.next != tt.want {
			t.Errorf("rank %d from per-rank keys: next %v, want %v", tt.r, rs.next, tt.want)
		}
	}
}
