package pipeline

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// TestShardEpochsAreDatasetEpochs: every epoch a shard set indexes is the
// epoch Dataset.Epoch orders for (seed, epoch) and Prepared.Plan plans (what
// serve and a one-epoch shard of that epoch give): the same plan hash, and
// rank by rank the same (step, micro-batch, id, weight) rows. For a plain
// input and for a mixture whose later epochs draw other samples and
// repetitions (stored once each in extra.arrow); every epoch's index places
// each of its planned draws once, on a stored row of the same id. Before, a
// mixture was refused with more than one epoch, and a plain input's later
// epochs were planned by a second order path (Permutation + Build).
func TestShardEpochsAreDatasetEpochs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   func(t *testing.T) Config
		extra bool // later epochs draw what the first epoch does not hold
	}{
		{"plain", func(t *testing.T) Config { return testConfig(corpus(t, 150, "jsonl")) }, false},
		{"mixture", func(t *testing.T) Config { return mixConfig(t, 200, 40, 60, 0.1, ", cap: 15") }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg(t)
			cfg.Plan.Seed, cfg.Plan.Epoch = 5, 1
			o := DefaultShardOptions()
			o.Epochs, o.PartSteps = 3, 2
			dir := t.TempDir()
			if _, _, err := runShard(t, cfg, dir, o, 0); err != nil {
				t.Fatal(err)
			}
			m := readManifest(t, dir)
			if len(m.Epochs) != o.Epochs {
				t.Fatalf("%d epoch indexes, want %d", len(m.Epochs), o.Epochs)
			}
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			data := make([][]arrow.RecordBatch, len(m.Files))
			for i, f := range m.Files {
				data[i] = readRecords(t, filepath.Join(dir, f.Path), mem)
			}
			defer func() {
				for _, recs := range data {
					for _, r := range recs {
						r.Release()
					}
				}
			}()
			d, err := OpenDataset(context.Background(), cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			first, novel := map[string]bool{}, 0
			for k, info := range m.Epochs {
				checkEpochIndex(t, filepath.Join(dir, info.Path), info, m, data, mem)
				for _, id := range checkIndexIsEpoch(t, d, cfg, info, filepath.Join(dir, info.Path), mem) {
					if k == 0 {
						first[id] = true
					} else if !first[id] {
						novel++
					}
				}
			}
			if (novel > 0) != tc.extra {
				t.Errorf("later epochs draw %d samples the first epoch does not, want some: %v", novel, tc.extra)
			}
		})
	}
}

// checkIndexIsEpoch compares the index at path with the plan of
// d.Epoch(info.Epoch) and returns that epoch's draw ids.
func checkIndexIsEpoch(t *testing.T, d *Dataset, cfg Config, info EpochIndexInfo, path string, mem memory.Allocator) []string {
	t.Helper()
	pc := cfg.Plan
	pc.Epoch = info.Epoch
	pe, err := d.Epoch(context.Background(), pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pe.Plan(pc.Strategy)
	if err != nil {
		t.Fatal(err)
	}
	if h := plan.Hash(); info.PlanHash != h {
		t.Errorf("epoch %d: index plan %s, Dataset.Epoch's plan %s", info.Epoch, info.PlanHash, h)
	}
	recs := readRecords(t, path, mem)
	defer func() {
		for _, r := range recs {
			r.Release()
		}
	}()
	type row struct {
		id       string
		step, mb int32
		weight   float32
	}
	for r, rec := range recs {
		var want []row
		for _, st := range plan.Steps {
			for m, mb := range st.Ranks[r] {
				for _, e := range mb {
					want = append(want, row{pe.Features.Items[e.Item].ID, int32(st.Index), int32(m), e.Weight})
				}
			}
		}
		ids, steps, mbs := rec.Column(0).(*array.String), rec.Column(1).(*array.Int32), rec.Column(2).(*array.Int32)
		w := rec.Column(6).(*array.Float32)
		if int(rec.NumRows()) != len(want) {
			t.Fatalf("epoch %d rank %d: %d index rows, the epoch's plan has %d", info.Epoch, r, rec.NumRows(), len(want))
		}
		for i, wr := range want {
			got := row{ids.Value(i), steps.Value(i), mbs.Value(i), w.Value(i)}
			if got != wr && !(wr.weight > 0 && got.weight == 0 && got.id == wr.id) { // a failed decode is stored at weight 0
				t.Fatalf("epoch %d rank %d row %d: index %+v, the epoch's plan %+v", info.Epoch, r, i, got, wr)
			}
		}
	}
	ids := make([]string, len(pe.Features.Items))
	for i, it := range pe.Features.Items {
		ids[i] = it.ID
	}
	return ids
}
