package report

import (
	"testing"
	"time"
)

func TestProgressMeter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var m ProgressMeter
	steps := []struct {
		name             string
		epoch, done, all int
		at               time.Duration
		moved            bool
		wantRate         float64
		wantETA          time.Duration
	}{
		{"first sight: no rate yet", 0, 10, 100, 0, true, 0, -1},
		{"10 steps in 5 s", 0, 20, 100, 5 * time.Second, true, 2, 40 * time.Second},
		{"nothing moved: no line", 0, 20, 100, 10 * time.Second, false, 0, 0},
		{"rate over the whole epoch so far", 0, 30, 100, 20 * time.Second, true, 1, 70 * time.Second},
		{"a new epoch starts a new measure", 1, 0, 50, 21 * time.Second, true, 0, -1},
		{"new epoch's rate", 1, 25, 50, 26 * time.Second, true, 5, 5 * time.Second},
		{"done", 1, 50, 50, 31 * time.Second, true, 5, 0},
	}
	for _, tt := range steps {
		l, moved := m.Update(tt.epoch, tt.done, tt.all, t0.Add(tt.at))
		if moved != tt.moved {
			t.Fatalf("%s: moved %v, want %v", tt.name, moved, tt.moved)
		}
		if moved && (l.Rate != tt.wantRate || l.ETA != tt.wantETA || l.Epoch != tt.epoch || l.Done != tt.done || l.Steps != tt.all) {
			t.Errorf("%s: got %+v, want rate %v eta %v", tt.name, l, tt.wantRate, tt.wantETA)
		}
	}
}
