package loader

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

func TestExpandBraces(t *testing.T) {
	tests := []struct {
		pattern string
		want    string // joined by " ", or the error text
	}{
		{"plain.tar", "plain.tar"},
		{"d-{000..003}.tar", "d-000.tar d-001.tar d-002.tar d-003.tar"},
		{"d-{8..10}.tar", "d-8.tar d-9.tar d-10.tar"},
		{"{a,b}/s-{0..1}.tar", "a/s-0.tar a/s-1.tar b/s-0.tar b/s-1.tar"},
		{"d-{5..5}.tar", "d-5.tar"},
		{"d-{3..1}.tar", "error: lo <= hi"},
		{"d-{a..b}.tar", "error: non-negative integers"},
		{"d-{0..2.tar", "error: unbalanced '{'"},
		{"d-0..2}.tar", "error: unbalanced '}'"},
		{"d-{x}.tar", "error: neither a range nor a list"},
		{"{a,{b,c}}", "error: nested braces"},
		{"{0..1048576}", "error: more than"},
		{"{0..1023}{0..1023}{0,1}", "error: more than"},
	}
	for _, tt := range tests {
		t.Run(tt.pattern, func(t *testing.T) {
			got, err := expandBraces(tt.pattern)
			if msg, isErr := strings.CutPrefix(tt.want, "error: "); isErr {
				if !errors.Is(err, ErrUnknownFormat) || !strings.Contains(err.Error(), msg) {
					t.Errorf("got %v, %v; want an ErrUnknownFormat containing %q", got, err, msg)
				}
				return
			}
			if err != nil || strings.Join(got, " ") != tt.want {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func FuzzExpandBraces(f *testing.F) {
	for _, s := range []string{"d-{000..009}.tar", "{a,b}{1..2}", "{", "}{", "{0..99999999999999999999}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, pattern string) {
		got, err := expandBraces(pattern)
		if err == nil && (len(got) == 0 || len(got) > maxBraceExpansion) {
			t.Errorf("%q: %d paths", pattern, len(got))
		}
	})
}

func TestOpenBraceShards(t *testing.T) {
	dir := t.TempDir()
	for i := range 3 {
		writeFile(t, filepath.Join(dir, fmt.Sprintf("data-%06d.tar", i)), tarBytes(t, []member{
			{fmt.Sprintf("s%d.jpg", i), "img"}, {fmt.Sprintf("s%d.txt", i), "caption"}}))
	}
	d := drain(t, filepath.Join(dir, "data-{000000..000002}.tar"), Options{})
	if got := strings.Join(ids(d.samples), ","); got != "s0,s1,s2" {
		t.Errorf("samples %s, want s0,s1,s2", got)
	}
	if _, err := Open(filepath.Join(dir, "data-{000000..000003}.tar"), Options{}); err == nil ||
		!strings.Contains(err.Error(), "data-000003.tar") {
		t.Errorf("a missing shard: got %v, want an error naming it", err)
	}
	writeFile(t, filepath.Join(dir, "x.tar.bz2"), []byte("bz"))
	if _, err := Open(filepath.Join(dir, "x.tar.bz2"), Options{}); !errors.Is(err, ErrUnknownFormat) ||
		!strings.Contains(err.Error(), ".tar.gz") {
		t.Errorf(".tar.bz2: got %v, want ErrUnknownFormat naming the formats read", err)
	}
}
