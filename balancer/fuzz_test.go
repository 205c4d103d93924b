package balancer

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzBuild plans arbitrary small item sets under arbitrary small layouts: it
// must never panic, and a successful plan keeps every invariant.
func FuzzBuild(f *testing.F) {
	f.Add([]byte{10, 200, 3, 40, 5, 255, 7, 8, 9, 1, 2, 3}, uint8(2), uint8(2), uint8(8), uint8(2), uint8(0))
	f.Add([]byte{0, 0, 1, 1, 2, 2}, uint8(1), uint8(1), uint8(1), uint8(1), uint8(7))
	f.Fuzz(fuzzBody)
}

func fuzzBody(t *testing.T, data []byte, dp, mbs, gb, la, flags uint8) {
	{
		if len(data) > 3*512 {
			return
		}
		items := make([]Item, 0, len(data)/3)
		for i := 0; i+2 < len(data); i += 3 {
			items = append(items, Item{
				ID:          string(rune('a'+data[i]%26)) + string(rune('a'+i%26)) + string(rune('a'+i/26%26)),
				TextTokens:  int(data[i]) - 2,
				ImageTokens: int(data[i+1]) * 4,
				Complexity:  float64(data[i+2]) / 255,
			})
		}
		cfg := DefaultConfig()
		cfg.DP, cfg.MicroBatches = int(dp%5)+1, int(mbs%4)+1
		cfg.GlobalBatch = max(int(gb), cfg.DP*cfg.MicroBatches)
		cfg.Lookahead = int(la%4) + 1
		cfg.Strategy = Strategy(int(flags) % int(numStrategies))
		cfg.Tail = Tail(flags >> 2 & 1)
		cfg.Placement = Placement(flags >> 3 & 1)
		if flags&16 != 0 {
			cfg.Budget = Budget{MaxSamples: 6, MaxPaddedTokens: 600, MaxImageTokens: 3000}
		}
		if flags&32 != 0 {
			cfg.GlobalBatch, cfg.GlobalTokens = 0, 50+int(gb)*4
		}
		p, err := Build(items, cfg)
		if err != nil {
			if !errors.Is(err, ErrBudgetExceeded) && !errors.Is(err, ErrTooFewItems) {
				t.Fatalf("unexpected error: %v", err)
			}
			return
		}
		checkPlan(t, items, p)
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", "q\"b\\s", "\x00\x1f<>&", "\u2028\u2029é", "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := appendJSONString(nil, s)
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("got %s, want %s", got, want)
		}
	})
}

func FuzzParseNames(f *testing.F) {
	for _, s := range []string{"mmfeed", "random", "length-grouped", "drop", "pad", "modality", "colocated", "tiny", "base", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if v, err := ParseStrategy(s); err == nil {
			if w, err := ParseStrategy(v.String()); err != nil || w != v {
				t.Fatalf("strategy %q round trip: %v %v", s, w, err)
			}
		} else if !errors.Is(err, ErrUnknownName) {
			t.Fatal(err)
		}
		if v, err := ParseTail(s); err == nil {
			if w, _ := ParseTail(v.String()); w != v {
				t.Fatalf("tail %q round trip", s)
			}
		}
		if v, err := ParseSync(s); err == nil {
			if w, _ := ParseSync(v.String()); w != v {
				t.Fatalf("sync %q round trip", s)
			}
		}
		if v, err := ParsePlacement(s); err == nil {
			if w, _ := ParsePlacement(v.String()); w != v {
				t.Fatalf("placement %q round trip", s)
			}
		}
		if _, err := Preset(s); err != nil && !errors.Is(err, ErrUnknownName) {
			t.Fatal(err)
		}
	})
}
