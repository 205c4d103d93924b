package main

import (
	"flag"
	"io"
	"reflect"
	"testing"

	"github.com/mmfeed/mmfeed/loader"
)

// --keep reaches the loader options of every command that takes job flags; a bad list is
// a flag error.
func TestKeepFlag(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want []loader.KeepField
		err  bool
	}{
		{"url,json:label", []loader.KeepField{{Name: "url", Kind: loader.KeepKey, Path: "url"}, {Name: "label", Kind: loader.KeepPath, Path: "label"}}, false},
		{"url,url", nil, true},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		j := bindJobFlags(fs)
		err := fs.Parse([]string{"--input", "m.jsonl", "--keep", tc.arg})
		if (err != nil) != tc.err {
			t.Fatalf("--keep %s: %v, want error %v", tc.arg, err, tc.err)
		}
		if err != nil {
			continue
		}
		c, err := j.config()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c.Loader.Keep, tc.want) {
			t.Errorf("--keep %s: %+v, want %+v", tc.arg, c.Loader.Keep, tc.want)
		}
	}
}
