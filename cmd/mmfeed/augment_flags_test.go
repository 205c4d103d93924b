package main

import (
	"flag"
	"testing"

	"github.com/mmfeed/mmfeed/imgproc"
)

// --augment parses into Config.Image.Augment, seeded by --augment-seed or
// else the job's --seed; no --augment is no augmentation whatever the seed.
func TestAugmentFlags(t *testing.T) {
	rrc := imgproc.Augment{RRC: true, Scale: imgproc.DefaultScale, Ratio: imgproc.DefaultRatio}
	withSeed := func(a imgproc.Augment, s uint64) imgproc.Augment { a.Seed = s; return a }
	both := rrc
	both.FlipP = 0.5
	for _, tc := range []struct {
		args []string
		want imgproc.Augment
		ok   bool
	}{
		{nil, imgproc.Augment{}, true},
		{[]string{"--augment-seed", "9"}, imgproc.Augment{}, true},
		{[]string{"--augment", "rrc"}, withSeed(rrc, 4), true},
		{[]string{"--augment", "rrc,hflip", "--augment-seed", "9"}, withSeed(both, 9), true},
		{[]string{"--augment", "hflip:p=1"}, imgproc.Augment{FlipP: 1, Seed: 4}, true},
		{[]string{"--augment", "rrc:scale=2-3"}, imgproc.Augment{}, false},
		{[]string{"--augment", "rrc", "--augment-seed", "-1"}, imgproc.Augment{}, false},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		j := bindJobFlags(fs)
		if err := fs.Parse(append([]string{"--input", "m.jsonl", "--seed", "4"}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		c, err := j.config()
		if (err == nil) != tc.ok || (err == nil && c.Image.Augment != tc.want) {
			t.Errorf("%v: augment %+v, err %v; want %+v, ok %v", tc.args, c.Image.Augment, err, tc.want, tc.ok)
		}
	}
}
