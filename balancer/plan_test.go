package balancer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

// checkPlan verifies the plan invariants: every valid item is planned exactly
// once with weight 1 (or dropped, or rejected), padding entries have weight 0,
// every step has DP ranks × MicroBatches non-empty micro-batches, steps are
// numbered 0…n-1, delays are within the lookahead and the mmfeed budget holds.
func checkPlan(t *testing.T, items []Item, p *Plan) {
	t.Helper()
	c := p.Config
	real := make([]int, len(items))
	for _, d := range p.Dropped {
		real[d]++
	}
	for _, r := range p.Rejected {
		real[r.Item]++
	}
	for k, s := range p.Steps {
		if s.Index != k {
			t.Fatalf("step %d has index %d", k, s.Index)
		}
		if len(s.Ranks) != c.DP {
			t.Fatalf("step %d has %d ranks, want %d", k, len(s.Ranks), c.DP)
		}
		for r, rank := range s.Ranks {
			if len(rank) != c.MicroBatches {
				t.Fatalf("step %d rank %d has %d micro-batches, want %d", k, r, len(rank), c.MicroBatches)
			}
			for m, mb := range rank {
				if len(mb) == 0 {
					t.Fatalf("step %d rank %d micro-batch %d is empty", k, r, m)
				}
				longest, sumP := 0, 0
				for _, e := range mb {
					switch e.Weight {
					case 1:
						real[e.Item]++
					case 0:
						if e.Delay != 0 {
							t.Fatalf("padding entry with delay %d", e.Delay)
						}
					default:
						t.Fatalf("weight %v", e.Weight)
					}
					if d := int(e.Delay); d >= c.Lookahead || d <= -c.Lookahead {
						t.Fatalf("delay %d outside lookahead %d", d, c.Lookahead)
					}
					longest = max(longest, items[e.Item].TextTokens)
					sumP += items[e.Item].ImageTokens
				}
				if c.Strategy == StrategyMmfeed && !c.Budget.Fits(len(mb), longest, sumP) {
					t.Fatalf("step %d rank %d micro-batch %d exceeds budget %+v", k, r, m, c.Budget)
				}
			}
		}
	}
	for i, n := range real {
		if n != 1 {
			t.Fatalf("item %d (%s) planned, dropped or rejected %d times", i, items[i].ID, n)
		}
	}
}

func planConfigs() map[string]Config {
	cfgs := map[string]Config{}
	for _, s := range Strategies() {
		for _, tail := range []Tail{TailDrop, TailPad} {
			for _, la := range []int{1, 3} {
				c := DefaultConfig()
				c.Strategy, c.Tail, c.Lookahead = s, tail, la
				cfgs[fmt.Sprintf("%v/%v/lookahead=%d", s, tail, la)] = c
				c.GlobalBatch, c.GlobalTokens = 0, 3000
				c.Placement = Modality
				cfgs[fmt.Sprintf("%v/%v/lookahead=%d/tokens", s, tail, la)] = c
				c.GlobalBatch, c.GlobalTokens = 100, 0
				c.MicroBatches, c.DP = 3, 7
				c.Budget = Budget{MaxSamples: 8, MaxPaddedTokens: 512}
				cfgs[fmt.Sprintf("%v/%v/lookahead=%d/odd", s, tail, la)] = c
			}
		}
	}
	return cfgs
}

func TestBuildProperties(t *testing.T) {
	for name, cfg := range planConfigs() {
		for _, n := range []int{0, 1, 31, 128, 1000, 1283} {
			t.Run(fmt.Sprintf("%s/n=%d", name, n), func(t *testing.T) {
				items := genItems(n, genDynamic, uint64(n))
				p, err := Build(items, cfg)
				if err != nil {
					t.Fatal(err)
				}
				checkPlan(t, items, p)
				q, err := Build(items, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := q.Hash(), p.Hash(); got != want {
					t.Fatalf("rebuild hash %s, want %s", got, want)
				}
			})
		}
	}
}

func TestBuildRejects(t *testing.T) {
	items := genItems(300, genFixed, 5)
	items[3].TextTokens = -4
	items[10].ID = items[9].ID
	items[20].TextTokens = 600 // over the padded-token budget alone
	cfg := DefaultConfig()
	cfg.Budget.MaxPaddedTokens = 512
	p, err := Build(items, cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkPlan(t, items, p)
	var got []int32
	for _, r := range p.Rejected {
		got = append(got, r.Item)
	}
	if want := []int32{3, 10, 20}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("rejected %v, want %v", got, want)
	}
	for _, r := range p.Rejected {
		if r.Reason == "" {
			t.Errorf("rejection of %d has no reason", r.Item)
		}
	}
}

func TestBuildTail(t *testing.T) {
	items := genItems(128*3+40, genFixed, 2)
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Strategy = s
			drop, err := Build(items, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := len(drop.Steps), 3; got != want {
				t.Errorf("drop: %d steps, want %d", got, want)
			}
			if got, want := len(drop.Dropped), 40; got != want {
				t.Errorf("drop: %d dropped, want %d", got, want)
			}
			cfg.Tail = TailPad
			pad, err := Build(items, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := len(pad.Steps), 4; got != want {
				t.Fatalf("pad: %d steps, want %d", got, want)
			}
			st := pad.Stats()[3]
			if got, want := st.Samples, 40; got != want {
				t.Errorf("pad: tail has %d real samples, want %d", got, want)
			}
			wantPad := 128 - 40 // baselines fill the global batch
			if s == StrategyMmfeed {
				wantPad = 0 // 40 ≥ dp × micro-batches: nothing to fill
			}
			if got := st.Padding; got != wantPad {
				t.Errorf("pad: tail has %d padding entries, want %d", got, wantPad)
			}
		})
	}
	small := genItems(128+5, genFixed, 3)
	cfg := DefaultConfig()
	cfg.Tail = TailPad
	p, err := Build(small, cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkPlan(t, small, p)
	if got, want := p.Stats()[1].Padding, 8*4-5; got != want {
		t.Errorf("mmfeed pads a 5-sample tail with %d entries, want %d", got, want)
	}
}

func TestBuildLookaheadDelay(t *testing.T) {
	items := genItems(128*40, genDynamic, 11)
	for _, la := range []int{1, 2, 5, 8} {
		cfg := DefaultConfig()
		cfg.Lookahead = la
		p, err := Build(items, cfg)
		if err != nil {
			t.Fatal(err)
		}
		checkPlan(t, items, p)
		if p.MaxDelay > la-1 || p.MinDelay < -(la-1) {
			t.Errorf("lookahead %d: delay [%d, %d] outside ±%d", la, p.MinDelay, p.MaxDelay, la-1)
		}
		if la > 1 && p.MaxDelay == 0 {
			t.Errorf("lookahead %d: no sample moved", la)
		}
	}
}

func TestBuildTokens(t *testing.T) {
	items := genItems(5000, genFixed, 4)
	cfg := DefaultConfig()
	cfg.GlobalBatch, cfg.GlobalTokens = 0, 4096
	for _, la := range []int{1, 4} {
		cfg.Lookahead = la
		p, err := Build(items, cfg)
		if err != nil {
			t.Fatal(err)
		}
		checkPlan(t, items, p)
		for _, st := range p.Stats() {
			if st.RealTokens > int64(cfg.GlobalTokens) {
				t.Fatalf("lookahead %d step %d has %d real tokens > %d", la, st.Step, st.RealTokens, cfg.GlobalTokens)
			}
			if st.Samples < cfg.DP*cfg.MicroBatches {
				t.Fatalf("step %d has %d samples", st.Step, st.Samples)
			}
		}
	}
}

func TestPlanResume(t *testing.T) {
	items := genItems(128*12+50, genDynamic, 6)
	for name, cfg := range planConfigs() {
		t.Run(name, func(t *testing.T) {
			p, err := Build(items, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var full bytes.Buffer
			if err := p.WriteJSONL(&full); err != nil {
				t.Fatal(err)
			}
			for _, s := range []int{0, 1, 5, len(p.Steps), len(p.Steps) + 3} {
				q, err := Build(items, cfg) // a restarted planner
				if err != nil {
					t.Fatal(err)
				}
				var got bytes.Buffer
				if err := q.From(s).WriteJSONL(&got); err != nil {
					t.Fatal(err)
				}
				var want bytes.Buffer
				for line := range strings.SplitSeq(strings.TrimSuffix(full.String(), "\n"), "\n") {
					var l struct {
						Step *int `json:"step"`
					}
					if err := json.Unmarshal([]byte(line), &l); err != nil {
						t.Fatal(err)
					}
					if l.Step == nil || *l.Step >= s {
						want.WriteString(line + "\n")
					}
				}
				if got.String() != want.String() {
					t.Fatalf("resume at %d differs from the full plan's tail", s)
				}
			}
		})
	}
}

// TestPlanGolden pins the serialized plan of a small input so that any change
// of the algorithm or format is deliberate (refresh with -update).
func TestPlanGolden(t *testing.T) {
	items := genItems(3*24+5, genDynamic, 42)
	items[7].ID = "needs \"escaping\"\n<é>"
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DP, cfg.MicroBatches, cfg.GlobalBatch, cfg.Lookahead = 3, 2, 24, 2
			cfg.Strategy, cfg.Tail, cfg.Epoch = s, TailPad, 3
			p, err := Build(items, cfg)
			if err != nil {
				t.Fatal(err)
			}
			sum := Summarize(p.Stats())
			t.Logf("step cost sum %.6g, imbalance p50 %.4f max %.4f, padding efficiency %.4f",
				sum.StepCostSum, sum.ImbalanceP50, sum.ImbalanceMax, sum.PaddingEfficiency)
			var buf bytes.Buffer
			if err := p.WriteJSONL(&buf); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(bytes.NewReader(buf.Bytes()))
			for sc.Scan() {
				if !json.Valid(sc.Bytes()) {
					t.Fatalf("invalid JSON line %q", sc.Text())
				}
			}
			golden := filepath.Join("testdata", "plan_"+s.String()+".jsonl")
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Fatalf("plan differs from %s (run with -update if intended)", golden)
			}
		})
	}
}

func TestBuildErrors(t *testing.T) {
	items := genItems(200, genFixed, 1)
	cfg := DefaultConfig()
	cfg.Budget.MaxSamples = 2 // 8 ranks × 4 × 2 = 64 < 128
	if _, err := Build(items, cfg); !errors.Is(err, ErrBudgetExceeded) {
		t.Errorf("got %v, want ErrBudgetExceeded", err)
	}
	cfg = DefaultConfig()
	cfg.DP = 0
	if _, err := Build(items, cfg); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("got %v, want ErrInvalidConfig", err)
	}
}
