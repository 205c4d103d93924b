package serve

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/proto"
)

// TestHandedStepsShareWrites: the handed steps of ranks whose fetches are
// answered at the same time are recorded together (one KV write for many
// ranks, not one per rank and step), each before its rank's hand returns,
// and a restarted table reads every rank's step back; a bucket of an
// earlier service, with only the per-rank keys, is read too.
func TestHandedStepsShareWrites(t *testing.T) {
	const n = 64
	srv := testnats.Server(t, testnats.Options{})
	_, js := testnats.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := proto.EnsureKV(ctx, js, "hand", false, 1)
	if err != nil {
		t.Fatal(err)
	}
	writes := func() uint64 {
		st, err := js.Stream(ctx, "KV_"+proto.BucketName("hand"))
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	st := &state{kv}
	tab := newRankTable(n, 1, nil, st)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := tab.hand(ctx, r, proto.BatchKey{Step: 2, MicroBatch: 1}); err != nil {
				t.Error(err)
			}
			// Recorded before hand returns: the bucket holds it now.
			var rec ranksRecord
			if ok, err := st.getJSON(ctx, kvHanded, &rec); err != nil || !ok || !covers(rec.Ranks[r], pos{Epoch: 0, Step: 2}) {
				t.Errorf("rank %d: after hand the bucket holds %v (ok %v, err %v)", r, rec.Ranks[r], ok, err)
			}
		}()
	}
	wg.Wait()
	got := writes()
	t.Logf("%d KV writes for %d ranks", got, n)
	if got == 0 || got > n/4 {
		t.Errorf("%d KV writes for %d ranks handed one step at once, want 1..%d", got, n, n/4)
	}
	again := newRankTable(n, 1, nil, st)
	for r := range n {
		rs, err := again.load(ctx, r, pos{})
		if err != nil {
			t.Fatal(err)
		}
		if !rs.recOK || rs.recorded != (pos{Epoch: 0, Step: 2}) {
			t.Errorf("rank %d after a restart: recorded %v (ok %v), want step 2", r, rs.recorded, rs.recOK)
		}
	}

	// An earlier service's bucket: rank.<dp>.<mp>.handed only.
	if err := kv.Delete(ctx, kvHanded); err != nil {
		t.Fatal(err)
	}
	if err := st.putJSON(ctx, kvRankHanded(3, 0), kvStep{0, 5}); err != nil {
		t.Fatal(err)
	}
	old := newRankTable(n, 1, nil, st)
	for _, tt := range []struct {
		r  int
		ok bool
	}{{3, true}, {4, false}} {
		rs, err := old.load(ctx, tt.r, pos{})
		if err != nil {
			t.Fatal(err)
		}
		if rs.recOK != tt.ok || (tt.ok && rs.recorded != (pos{Epoch: 0, Step: 5})) {
			t.Errorf("rank %d from per-rank keys: recorded %v (ok %v), want ok %v", tt.r, rs.recorded, rs.recOK, tt.ok)
		}
	}
}
