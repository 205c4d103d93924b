package work

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/mmfeed/mmfeed/loader/synth"
	"github.com/mmfeed/mmfeed/pipeline"
)

// A worker keeps at most maxDatasets datasets open: it closes the least
// recently used one that no item uses, never one in use.
func TestWorkerEvictsIdleDatasets(t *testing.T) {
	sc := synth.DefaultConfig()
	sc.Out, sc.Samples, sc.Seed, sc.Format = t.TempDir(), 10, 7, "jsonl"
	sum, err := synth.Generate(context.Background(), sc)
	if err != nil {
		t.Fatal(err)
	}
	pc := pipeline.DefaultConfig()
	pc.Input, pc.Image.Size, pc.Image.PatchSize = sum.Path, 32, 16
	w := &Worker{log: testnats.Logger(t), datasets: map[string]*workerDataset{}}
	t0 := time.Now()
	for i := range maxDatasets + 2 {
		ds, err := pipeline.OpenDataset(context.Background(), pc, nil)
		if err != nil {
			t.Fatal(err)
		}
		d := &workerDataset{ds: ds, used: t0.Add(time.Duration(i) * time.Second)}
		if i == 0 {
			d.users = 1 // the oldest is in use: it stays
		}
		w.mu.Lock()
		w.datasets[fmt.Sprint(i)] = d
		w.evictLocked(fmt.Sprint(i))
		w.mu.Unlock()
	}
	defer w.Close()
	var kept []string
	for k := range w.datasets {
		kept = append(kept, k)
	}
	if len(w.datasets) != maxDatasets || w.datasets["0"] == nil || w.datasets["1"] != nil || w.datasets["2"] != nil {
		t.Errorf("kept %v, want the one in use (0) and the newest ones", kept)
	}
}
