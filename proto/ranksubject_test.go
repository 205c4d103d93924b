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

// FuzzParseRankControlSubject: any subject either fails with
// ErrInvalidName or parses into parts that format back to the same subject.
func FuzzParseRankControlSubject(f *testing.F) {
	for _, s := range []string{"mmfeed.clip.ctl.done.3.1", "mmfeed.clip.ctl.register.0.0", "mmfeed.a.ctl.x.01.1", "mmfeed..ctl.done.1.1", "", "....."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, subj string) {
		job, kind, dp, mp, err := ParseRankControlSubject(subj)
		if err != nil {
			if !errors.Is(err, ErrInvalidName) {
				t.Fatalf("%q: error %v is not ErrInvalidName", subj, err)
			}
			return
		}
		back, err := RankControlSubject(job, kind, dp, mp)
		if err != nil || back != subj {
			t.Fatalf("%q parsed to %q %q %d %d, formats back to %q, %v", subj, job, kind, dp, mp, back, err)
		}
	})
}
