package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/loader/synth"
)

// mixCorpus generates a corpus of n samples (bad is the share of bad ones)
// with seed 42: two corpora of one format share their ids, which a mixture
// must keep apart.
func mixCorpus(t *testing.T, n int, format string, bad float64) string {
	t.Helper()
	cfg := synth.DefaultConfig()
	cfg.Out, cfg.Samples, cfg.Seed, cfg.Format, cfg.BadFraction = t.TempDir(), n, 42, format, bad
	sum, err := synth.Generate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sum.Path
}

// mixConfig is testConfig over a 6:3:1 mixture of a JSONL, a WebDataset and
// another JSONL corpus of sizes web, coco, own, from a YAML file.
func mixConfig(t *testing.T, web, coco, own int, bad float64, extra string) Config {
	t.Helper()
	dir := t.TempDir()
	yaml := "sources:\n" +
		"  - {name: web, path: " + mixCorpus(t, web, "jsonl", 0) + ", weight: 6}\n" +
		"  - {name: coco, path: " + mixCorpus(t, coco, "wds", 0) + ", weight: 3}\n" +
		"  - {name: own, path: " + mixCorpus(t, own, "jsonl", bad) + ", weight: 1" + extra + "}\n"
	p := filepath.Join(dir, "mix.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := loader.LoadMixture(p)
	if err != nil {
		t.Fatal(err)
	}
	c := testConfig("")
	c.Mixture = m
	return c
}

func sourceOfID(id string) string { s, _, _ := strings.Cut(id, "/"); return s }

// TestMixtureEpoch: 6:3:1 over an epoch (the heaviest source once through)
// are realised within ±1% in the epoch's items and in the plan's report;
// sources with fewer samples than their draws repeat them as distinct draw
// ids; every draw is planned, dropped at the tail or quarantined.
func TestMixtureEpoch(t *testing.T) {
	cfg := mixConfig(t, 600, 200, 40, 0.1, "")
	var q bytes.Buffer
	prep, err := Prepare(context.Background(), cfg, &q)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	srcs := prep.ds.MixtureSources()
	if got := []int{srcs[0].Draws, srcs[1].Draws, srcs[2].Draws}; !slices.Equal(got, []int{600, 300, 100}) {
		t.Fatalf("draws per source %v, want [600 300 100]", got)
	}
	want := map[string]float64{"web": 0.6, "coco": 0.3, "own": 0.1}
	count := map[string]int{}
	ids := map[string]bool{}
	repeats := 0
	for i, it := range prep.Features.Items {
		if ids[it.ID] {
			t.Fatalf("draw id %s twice in the epoch", it.ID)
		}
		ids[it.ID] = true
		if e := prep.Features.Entry(i); e.ID != it.ID {
			t.Fatalf("item %d: entry id %s, item id %s", i, e.ID, it.ID)
		}
		if r := prep.Features.Repeat(i); r > 0 {
			repeats++
			if _, rep, ok := loader.DrawBase(it.ID); !ok || rep != r {
				t.Fatalf("repeat %d has id %s", r, it.ID)
			}
		}
		count[sourceOfID(it.ID)]++
		if got := prep.ds.mix.index.Names[prep.SourceOf(i)]; got != sourceOfID(it.ID) {
			t.Fatalf("item %s: SourceOf %s", it.ID, got)
		}
	}
	if repeats < 100 {
		t.Fatalf("%d repeated draws, want at least coco's 100", repeats)
	}
	// every draw is an item or a quarantined draw of a bad sample of own
	drawRejects := int(prep.Quarantine.Total()) - len(prep.ds.scanned)
	if got := len(prep.Features.Items) + drawRejects; got != 1000 {
		t.Fatalf("%d items + %d quarantined draws = %d, want the epoch's 1000 draws", len(prep.Features.Items), drawRejects, got)
	}
	for name, share := range want {
		got := float64(count[name]) / float64(len(prep.Features.Items))
		if math.Abs(got-share) > 0.01 {
			t.Errorf("source %s: share %.4f of the epoch's items, want %.2f ±0.01 (%v)", name, got, share, count)
		}
	}
	plan, err := prep.Plan(balancer.StrategyMmfeed)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Rejected) != 0 {
		t.Fatalf("plan rejected %d draws: %v", len(plan.Rejected), plan.Rejected[0])
	}
	rep := prep.MixtureReport(plan)
	if rep.Planned+len(plan.Dropped) != len(prep.Features.Items) {
		t.Fatalf("report: %d planned + %d dropped, want %d items", rep.Planned, len(plan.Dropped), len(prep.Features.Items))
	}
	for _, s := range rep.Sources {
		if math.Abs(s.Share-want[s.Name]) > 0.01 || s.WantShare != want[s.Name] {
			t.Errorf("report: source %s share %.4f (want share %.2f), want %.2f ±0.01", s.Name, s.Share, s.WantShare, want[s.Name])
		}
		if s.SamplesPerStep <= 0 || s.TextTokensPerStep <= 0 || s.CostPerStep <= 0 || s.MinSamplesPerStep > s.MaxSamplesPerStep {
			t.Errorf("report: source %s per step: %+v", s.Name, s)
		}
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "coco") {
		t.Fatalf("report text %q, %v", text.String(), err)
	}
}

// TestMixtureResumeSameSequence: a dataset opened again (a restarted
// service) orders and plans the same epoch identically, so a resume at a
// mid-epoch step continues the same draws; another epoch differs.
func TestMixtureResumeSameSequence(t *testing.T) {
	cfg := mixConfig(t, 300, 100, 30, 0, "")
	cfg.Plan.Seed, cfg.Plan.Epoch = 9, 2
	planIDs := func(from int) []string {
		prep, err := Prepare(context.Background(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer prep.Close()
		plan, err := prep.Plan(balancer.StrategyMmfeed)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, st := range plan.From(from).Steps {
			for _, r := range st.Ranks {
				for _, mb := range r {
					for _, e := range mb {
						out = append(out, prep.Features.Entry(int(e.Item)).ID)
					}
				}
			}
		}
		return out
	}
	all := planIDs(0)
	mid := planIDs(7)
	if len(mid) == 0 || len(mid) >= len(all) || !slices.Equal(all[len(all)-len(mid):], mid) {
		t.Fatalf("resume at step 7 gives %d draws that are not the last %d of the epoch's %d", len(mid), len(mid), len(all))
	}
	cfg.Plan.Epoch = 3
	if other := planIDs(0); slices.Equal(other, all) {
		t.Fatal("epochs 2 and 3 give the same sequence")
	}
}

// TestMixtureCapsAndValidation: a cap lowers a source's draws; a mixture
// and an input together, an empty source and a missing source fail clearly.
func TestMixtureCapsAndValidation(t *testing.T) {
	cfg := mixConfig(t, 200, 50, 30, 0, ", cap: 25")
	prep, err := Prepare(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	srcs := prep.ds.MixtureSources()
	prep.Close()
	if got := []int{srcs[0].Draws, srcs[1].Draws, srcs[2].Draws}; !slices.Equal(got, []int{200, 100, 25}) {
		t.Fatalf("draws %v, want [200 100 25]", got)
	}
	both := cfg
	both.Input = "x.jsonl"
	if err := both.Validate(); err == nil || !strings.Contains(err.Error(), "both") {
		t.Fatalf("input and mixture: %v", err)
	}
	missing := cfg
	missing.Mixture = &loader.Mixture{Sources: slices.Clone(cfg.Mixture.Sources)}
	missing.Mixture.Sources[1].Path = filepath.Join(t.TempDir(), "nope.jsonl")
	if _, err := Prepare(context.Background(), missing, nil); err == nil || !strings.Contains(err.Error(), "mixture source coco") {
		t.Fatalf("missing source: %v, want an error naming source coco", err)
	}
	empty := cfg
	empty.Mixture = &loader.Mixture{Sources: slices.Clone(cfg.Mixture.Sources)}
	ep := filepath.Join(t.TempDir(), "empty.jsonl")
	os.WriteFile(ep, nil, 0o644)
	empty.Mixture.Sources[2].Path = ep
	if _, err := Prepare(context.Background(), empty, nil); err == nil || !strings.Contains(err.Error(), `"own" has no samples`) {
		t.Fatalf("empty source: %v", err)
	}
}

// TestMixtureFingerprint: the feature cache's fingerprint covers the
// mixture's definition (a weight), not only the entries.
func TestMixtureFingerprint(t *testing.T) {
	cfg := mixConfig(t, 60, 30, 10, 0, "")
	prep, err := Prepare(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	a, err := Fingerprint(cfg, prep.Index)
	if err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.Mixture = &loader.Mixture{Sources: slices.Clone(cfg.Mixture.Sources)}
	other.Mixture.Sources[0].Weight = 5
	b, err := Fingerprint(other, prep.Index)
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatal("another weight gives the same fingerprint")
	}
}

// TestOrderDraws: a sample drawn twice is two items with distinct ids (the
// repetition's is its draw id, in Items and Entry), and a rejected sample
// drawn twice is quarantined twice, once under each draw id.
func TestOrderDraws(t *testing.T) {
	dir := t.TempDir()
	var man bytes.Buffer
	for _, id := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(dir, id+".jpg"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		man.WriteString(`{"id": "` + id + `", "image": "` + id + `.jpg", "text": "t"}` + "\n")
	}
	mp := filepath.Join(dir, "m.jsonl")
	if err := os.WriteFile(mp, man.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	ix, err := loader.BuildIndex(context.Background(), mp, loader.Options{})
	if err != nil {
		t.Fatal(err)
	}
	all := []EntryFeatures{
		{Item: balancer.Item{ID: "a", TextTokens: 3}},
		{Item: balancer.Item{ID: "b"}, Reject: &loader.Reject{ID: "b", Reason: "image_unsupported"}},
	}
	var qb bytes.Buffer
	q := loader.NewQuarantineWriter(&qb)
	f, err := orderFeatures(ix, all, []int{0, 1, 0, 1}, []int32{0, 0, 1, 1}, q)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, it := range f.Items {
		got = append(got, it.ID+"="+f.Entry(i).ID)
	}
	if want := "[a=a a#1=a#1]"; fmt.Sprint(got) != want || f.Repeat(1) != 1 || f.Repeat(0) != 0 {
		t.Fatalf("items %v, want %s with repeats 0, 1", got, want)
	}
	rj, err := loader.ReadQuarantine(&qb)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rj {
		ids = append(ids, r.ID)
	}
	if fmt.Sprint(ids) != "[b b#1]" {
		t.Fatalf("quarantined %v, want [b b#1]", ids)
	}
}
