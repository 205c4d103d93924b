package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The rate counts from when the work started, not from the first callback
// (which made the first frame done over a microsecond: millions per second).
func TestProgressFirstFrameRate(t *testing.T) {
	clock := time.Unix(0, 0)
	now := func() time.Time { return clock }
	var buf bytes.Buffer
	p := newProgress(&buf, "features", "samples", now, 0)
	clock = clock.Add(200 * time.Millisecond) // the work before the first callback
	p(64, 300)
	frames := strings.Split(buf.String(), "\r")
	if got, want := frames[len(frames)-1], "features 320 samples/s, 1s left  21%"; !strings.HasPrefix(got, want) ||
		!strings.HasSuffix(strings.TrimSpace(got), "(64/300)") {
		t.Errorf("first frame %q, want %q ... (64/300)", got, want)
	}
}

func TestRateText(t *testing.T) {
	for _, tc := range []struct {
		done, total int
		elapsed     time.Duration
		want        string
	}{
		{0, 300, time.Second, ""},
		{64, 300, time.Microsecond, ""},
		{64, 300, 200 * time.Millisecond, " 320 samples/s, 1s left"},
		{3, 9, 2 * time.Second, " 1.5 samples/s, 4s left"},
		{9, 9, 3 * time.Second, " 3.0 samples/s"},
	} {
		if got := rateText(tc.done, tc.total, tc.elapsed, "samples"); got != tc.want {
			t.Errorf("rateText(%d, %d, %v) = %q, want %q", tc.done, tc.total, tc.elapsed, got, tc.want)
		}
	}
}
