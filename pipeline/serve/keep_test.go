package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/proto"
)

// keepManifest adds "url" to every line of the manifest at path and an integer
// "label" to lines whose number is not a multiple of 4; it returns the kept values
// each id should carry (label nil: null).
func keepManifest(t testing.TB, path string) map[string][2]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]byte
	want := map[string][2]any{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 0; sc.Scan(); n++ {
		var obj map[string]any
		if json.Unmarshal(sc.Bytes(), &obj) != nil {
			lines = append(lines, append([]byte(nil), sc.Bytes()...)) // a broken line stays broken
			continue
		}
		id, _ := obj["id"].(string)
		obj["url"] = "https://example.com/" + strconv.Itoa(n) + ".jpg"
		w := [2]any{obj["url"], nil}
		if n%4 != 0 {
			obj["label"], w[1] = n%3, strconv.Itoa(n%3)
		}
		want[id] = w
		b, _ := json.Marshal(obj)
		lines = append(lines, b)
	}
	f.Close()
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		out.Write(append(l, '\n'))
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return want
}

// TestServeKeepsColumns: with --keep url,json:label the batches every rank receives
// carry keep.url (utf8) and keep.label (int64, null where the manifest line has none),
// whether the service builds them itself or workers build them from work items, and on
// both mp ranks of modality placement.
func TestServeKeepsColumns(t *testing.T) {
	for _, tc := range []struct {
		name, placement string
		mp              int
		workers         bool
	}{
		{"all", "colocated", 1, false},
		{"workers", "colocated", 1, true},
		{"modality workers", "modality", 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			input := corpus(t, 40)
			want := keepManifest(t, input)
			cfg := testConfig(t, input, 2, tc.mp, tc.placement)
			cfg.Recalibrate = -1
			if tc.workers {
				cfg.Role, cfg.LocalWorkers = RolePlanner, 2
			}
			var err error
			if cfg.Pipeline.Loader.Keep, err = loader.ParseKeep("url,json:label"); err != nil {
				t.Fatal(err)
			}
			r := start(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// The job is shorter than the comparison's build under -race: hold
			// the first step until the live report has it.
			trs := runTrainersWith(t, ctx, cfg, r.s.ClientURL(), []int{0}, true, func(tr *trainer) {
				tr.barrier = func(ctx context.Context, _ proto.BatchKey) error { return awaitComparison(ctx, r.s) }
			})
			if err := r.wait(t, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			rows, labels, nulls := 0, 0, 0
			for _, tr := range trs {
				for k, batch := range tr.applied {
					for _, row := range batch {
						rows++
						w, ok := want[row.ID]
						if !ok || len(row.Keep) != 2 || row.Keep[0] != (proto.KeepValue{Text: w[0].(string), Valid: true}) {
							t.Fatalf("%v row %s: kept %+v, want url %v", k, row.ID, row.Keep, w[0])
						}
						switch l := w[1]; {
						case l == nil && row.Keep[1].Valid:
							t.Errorf("%v row %s: label %+v, want null", k, row.ID, row.Keep[1])
						case l != nil && row.Keep[1] != (proto.KeepValue{Text: l.(string), Num: true, Valid: true}):
							t.Errorf("%v row %s: label %+v, want %v", k, row.ID, row.Keep[1], l)
						case l == nil:
							nulls++
						default:
							labels++
						}
					}
				}
			}
			if rows == 0 || labels == 0 || nulls == 0 {
				t.Errorf("%d rows: %d labels, %d nulls; want both", rows, labels, nulls)
			}
			rep := r.s.snapshot()
			if rep == nil || len(rep.Kept) != 2 || rep.Kept[1].Name != "label" || rep.Kept[1].Type != proto.KeepInt64 || rep.Kept[1].Missing == 0 {
				t.Errorf("live report kept columns %+v, want url and label (int64, some missing)", rep)
			}
		})
	}
}

// awaitComparison returns once s's live report holds the strategy
// comparison (built in the background after the epoch is planned).
func awaitComparison(ctx context.Context, s *Service) error {
	for s.snapshot() == nil {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}
