package serve

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/hostile"
	"github.com/mmfeed/mmfeed/loader"
)

// TestServeHostileInputs serves each hostile dataset (internal/hostile) to
// two trainer ranks: the job completes, each hostile sample is quarantined
// with its reason in the epoch's quarantine file, and every sample is
// applied once, quarantined or dropped at the tail.
func TestServeHostileInputs(t *testing.T) {
	for _, format := range []string{"jsonl", "folder", "wds", "parquet"} {
		t.Run(format, func(t *testing.T) {
			input, want := hostile.Dataset(t, format)
			cfg := testConfig(t, input, 2, 1, "colocated")
			cfg.Recalibrate = -1
			cfg.QuarantineDir = t.TempDir()
			cfg.Pipeline.Image.MaxImagePixels = 4 << 20
			r := start(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			trs := runTrainers(t, ctx, cfg, r.s.ClientURL(), []int{0})
			if err := r.wait(t, 30*time.Second); err != nil {
				t.Fatalf("service: %v", err)
			}
			f, err := os.Open(fmt.Sprintf("%s/quarantine-e0.jsonl", cfg.QuarantineDir))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			rejects, err := loader.ReadQuarantine(f)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, rj := range rejects {
				for _, h := range want {
					if h.Loc != "" && strings.HasSuffix(rj.Location, h.Loc) {
						rj.ID = h.ID
					}
				}
				got[rj.ID] = rj.Reason
			}
			for _, h := range want {
				if h.Reason != "" && got[h.ID] != h.Reason {
					t.Errorf("%s: quarantined as %q, want %q", h.ID, got[h.ID], h.Reason)
				}
			}
			ex := shardExpectation(t, cfg, 0)
			realOnce(t, trs, 0, ex, len(rejects))
		})
	}
}
