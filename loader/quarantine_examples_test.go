package loader

import (
	"slices"
	"testing"
)

func TestQuarantineExamples(t *testing.T) {
	q := NewQuarantineWriter(nil)
	for _, r := range []Reject{
		{ID: "a", Reason: ReasonEmptyImage}, {ID: "b", Reason: ReasonEmptyImage}, {Location: "m.jsonl:3", Reason: ReasonEmptyImage},
		{ID: "d", Reason: ReasonEmptyImage}, {ID: "e", Reason: ReasonMissingImage},
	} {
		_ = q.Write(r)
	}
	ex := q.Examples()
	tests := []struct {
		reason string
		want   []string
	}{
		{ReasonEmptyImage, []string{"a", "b", "m.jsonl:3"}}, // the first QuarantineExamples, location when no id
		{ReasonMissingImage, []string{"e"}},
	}
	for _, tt := range tests {
		if got := ex[tt.reason]; !slices.Equal(got, tt.want) {
			t.Errorf("%s examples %v, want %v", tt.reason, got, tt.want)
		}
	}
	ex[ReasonMissingImage][0] = "changed"
	if q.Examples()[ReasonMissingImage][0] != "e" {
		t.Error("Examples returned the writer's own slice")
	}
}
