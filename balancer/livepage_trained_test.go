package balancer

import (
	"bytes"
	"strings"
	"testing"
)

// TestLiveTrainedSteps: the live section says finished only when every step
// is published and trained, shows trained steps beside published, and
// estimates the time left from the training rate.
func TestLiveTrainedSteps(t *testing.T) {
	tests := []struct {
		name                      string
		published, trained, total int
		finished                  bool
		wantDone                  bool
		wantETA                   float64
		contains, lacks           string
	}{
		{"publishing, training behind", 6, 3, 12, false, false, 60, "3</span> of 12 steps trained", "<b>finished</b>"},
		{"published, half trained", 12, 6, 12, true, false, 20, "<b>publishing finished</b>, trainers still training", "<b>finished</b>"},
		{"published, nothing trained", 12, 0, 12, true, false, -1, "ETA <span id=\"eta\">unknown", "<b>finished</b>"},
		{"before any trainer", 4, 0, 12, false, false, 40, "0</span> of 12 steps trained", "publishing finished"},
		{"all trained", 12, 12, 12, true, true, 0, "<b>finished</b>", "ETA"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := &LiveView{Job: "j", Finished: tc.finished, StepsPublished: tc.published, StepsTrained: tc.trained, StepsTotal: tc.total, ElapsedSeconds: 20}
			if got := l.Done(); got != tc.wantDone {
				t.Errorf("Done() = %v, want %v", got, tc.wantDone)
			}
			if got := l.ETASeconds(); got != tc.wantETA {
				t.Errorf("ETASeconds() = %v, want %v", got, tc.wantETA)
			}
			var b bytes.Buffer
			if err := WriteLiveHTML(&b, l); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(b.String(), tc.contains) || strings.Contains(b.String(), tc.lacks) {
				t.Errorf("live section lacks %q or has %q:\n%s", tc.contains, tc.lacks, b.String())
			}
		})
	}
}
