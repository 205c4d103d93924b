package deliver

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/proto"
)

// TestHandedStepsShareWrites: the handed steps of ranks whose fetches are
// answered at the same time are recorded together (one KV write for many
// ranks, not one per rank and step), each before its rank's hand returns,
// and a restarted table reads every rank's step back; a bucket of an
// earlier service, with only the per-rank keys, is read too.
func TestHandedStepsShareWrites(t *testing.T) {
	const n = 64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := newMemStore()
	tab := NewRanks(n, 1, nil, st)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := tab.Hand(ctx, r, proto.BatchKey{Step: 2, MicroBatch: 1}); err != nil {
				t.Error(err)
			}
			// Recorded before hand returns: the bucket holds it now.
			var rec RanksRecord
			if ok, err := st.GetJSON(ctx, KeyHanded, &rec); err != nil || !ok || !covers(rec.Ranks[r], proto.Pos{Epoch: 0, Step: 2}) {
				t.Errorf("rank %d: after hand the bucket holds %v (ok %v, err %v)", r, rec.Ranks[r], ok, err)
			}
		}()
	}
	wg.Wait()
	got := st.writeCount()
	t.Logf("%d KV writes for %d ranks", got, n)
	if got == 0 || got > n/4 {
		t.Errorf("%d KV writes for %d ranks handed one step at once, want 1..%d", got, n, n/4)
	}
	again := NewRanks(n, 1, nil, st)
	for r := range n {
		rs, err := again.Load(ctx, r, proto.Pos{})
		if err != nil {
			t.Fatal(err)
		}
		if !rs.recOK || rs.recorded != (proto.Pos{Epoch: 0, Step: 2}) {
			t.Errorf("rank %d after a restart: recorded %v (ok %v), want step 2", r, rs.recorded, rs.recOK)
		}
	}

	// An earlier service's bucket: rank.<dp>.<mp>.handed only.
	st.delete(KeyHanded)
	if err := st.PutJSON(ctx, rankHandedKey(3, 0), KVStep{0, 5}); err != nil {
		t.Fatal(err)
	}
	old := NewRanks(n, 1, nil, st)
	for _, tt := range []struct {
		r  int
		ok bool
	}{{3, true}, {4, false}} {
		rs, err := old.Load(ctx, tt.r, proto.Pos{})
		if err != nil {
			t.Fatal(err)
		}
		if rs.recOK != tt.ok || (tt.ok && rs.recorded != (proto.Pos{Epoch: 0, Step: 5})) {
			t.Errorf("rank %d from per-rank keys: recorded %v (ok %v), want ok %v", tt.r, rs.recorded, rs.recOK, tt.ok)
		}
	}
}
