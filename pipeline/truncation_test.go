package pipeline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader/synth"
)

// captionCorpus generates n good samples and gives the first long of them a
// caption far over 128 tokens, the others a short one.
func captionCorpus(t *testing.T, n, long int) string {
	t.Helper()
	cfg := synth.DefaultConfig()
	cfg.Out, cfg.Samples, cfg.Seed, cfg.Format, cfg.BadFraction = t.TempDir(), n, 5, "jsonl", 0
	sum, err := synth.Generate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(sum.Path)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(b))
	for i := 0; sc.Scan(); i++ {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		line["text"] = "a short caption of a photo"
		if i < long {
			line["text"] = strings.Repeat("a very long caption that goes on ", 60)
		}
		enc, _ := json.Marshal(line)
		out.Write(append(enc, '\n'))
	}
	if err := os.WriteFile(sum.Path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return sum.Path
}

// TestTextTruncationCounted: the report counts the captions cut at
// --max-length with their share, the page shows them, and the warning
// comes above 1%.
func TestTextTruncationCounted(t *testing.T) {
	const n = 200
	tests := []struct {
		long int
		warn bool
	}{{0, false}, {2, false}, {3, true}, {40, true}} // 2 of 200 is 1%: not above
	for _, tc := range tests {
		t.Run(strconv.Itoa(tc.long), func(t *testing.T) {
			cfg := testConfig(captionCorpus(t, n, tc.long))
			prep, err := Prepare(context.Background(), cfg, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			defer prep.Close()
			rep, err := prep.Report()
			if err != nil {
				t.Fatal(err)
			}
			tt := rep.TextTruncation
			want := balancer.TextTruncation{MaxLength: 128, Captions: n, AtMaxLength: tc.long, Share: float64(tc.long) / n}
			if tt == nil || *tt != want {
				t.Fatalf("text_truncation %+v, want %+v", tt, want)
			}
			if w := TruncationWarning(tt); (w != "") != tc.warn || (tc.warn && !strings.Contains(w, strconv.Itoa(tc.long)+" of 200 captions")) {
				t.Errorf("warning %q, want one: %v", w, tc.warn)
			}
			var page bytes.Buffer
			if err := balancer.WriteHTML(&page, rep); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(page.String(), `data-key="text_truncation.at_max_length">`+strconv.Itoa(tc.long)+"<") ||
				strings.Contains(page.String(), "more than 1%") != tc.warn {
				t.Errorf("page does not show %d truncated captions (warning %v)", tc.long, tc.warn)
			}
		})
	}
}
