package control

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRateLogSuppresses: a flood of one kind of line writes one line a
// second, the next one names how many were held back; another kind is not
// held back by it.
func TestRateLogSuppresses(t *testing.T) {
	var buf bytes.Buffer
	r := NewRateLog(slog.New(slog.NewTextHandler(&buf, nil)))
	now := time.Unix(0, 0)
	r.now = func() time.Time { return now }
	for range 20000 {
		r.Warn("a", "bad control message")
	}
	r.Warn("b", "other")
	now = now.Add(RateLogEvery)
	r.Warn("a", "bad control message")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines for 20002 warnings over two intervals, want 3:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[2], "suppressed=19999") {
		t.Errorf("last line %q does not report the 19999 held back", lines[2])
	}
}
