package proto

import (
	"errors"
	"testing"
)

func TestRankControlSubject(t *testing.T) {
	s, err := RankControlSubject("clip", CtlDone, 3, 1)
	if got, want := s, "mmfeed.clip.ctl.done.3.1"; err != nil || got != want {
		t.Fatalf("RankControlSubject: got %q, %v, want %q", got, err, want)
	}
	job, kind, dp, mp, err := ParseRankControlSubject(s)
	if err != nil || job != "clip" || kind != CtlDone || dp != 3 || mp != 1 {
		t.Errorf("ParseRankControlSubject(%q) = %q %q %d %d %v", s, job, kind, dp, mp, err)
	}
	for _, bad := range []string{"mmfeed.clip.ctl.done", "mmfeed.clip.batch.done.3.1", "mmfeed.clip.ctl.done.03.1",
		"mmfeed.clip.ctl.done.1.-1", "x.clip.ctl.done.1.1", "mmfeed.a*b.ctl.done.1.1", "mmfeed.clip.ctl.d*.1.1"} {
		if _, _, _, _, err := ParseRankControlSubject(bad); !errors.Is(err, ErrInvalidName) {
			t.Errorf("ParseRankControlSubject(%q) = %v, want ErrInvalidName", bad, err)
		}
	}
	if _, err := RankControlSubject("clip", CtlDone, -1, 0); !errors.Is(err, ErrInvalidName) {
		t.Errorf("RankControlSubject(dp -1) = %v, want ErrInvalidName", err)
	}
	in, err := InboxPrefix("clip", 2, 0)
	if got, want := in, "_INBOX.mmfeed.clip.2.0"; err != nil || got != want {
		t.Errorf("InboxPrefix: got %q, %v, want %q", got, err, want)
	}
}
