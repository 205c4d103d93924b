package loader

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type member struct {
	name string
	data string
}

// tarBytes builds a tar archive of members.
func tarBytes(t testing.TB, ms []member) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range ms {
		hdr := &tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.data)), Typeflag: tar.TypeReg}
		if m.name[len(m.name)-1] == '/' {
			hdr = &tar.Header{Name: m.name, Mode: 0o755, Typeflag: tar.TypeDir}
		}
		must(t, tw.WriteHeader(hdr))
		_, err := tw.Write([]byte(m.data))
		must(t, err)
	}
	must(t, tw.Close())
	return buf.Bytes()
}

func TestTarSource(t *testing.T) {
	good := []member{
		{"sub/", ""},
		{"sub/000001.jpg", "img1"}, {"sub/000001.txt", "caption one"},
		{"000002.json", `{"caption":"from json","id":"custom-2"}`}, {"000002.png", "img2"},
		{"000003.jpg", "img3"}, {"000003.cls", "7"}, {"000003.json", `{"text":"t3"}`}, {"000003.txt", "txt wins"},
		{"000004.jpg", "img4"}, // no caption
		{"000005.txt", "no image"},
		{"000006.jpg", "toolarge-image-bytes"}, {"000006.txt", "t"},
		{"000007.jpg", ""}, {"000007.txt", "zero"},
		{"000008.jpg", "img8"}, {"000008.txt", "   "},
		{"000009.jpg", "img9"}, {"000009.json", `{"caption":`},
		{"a.b.c.jpg", "img10"}, {"a.b.c.txt", "key up to first dot"},
	}
	dir := t.TempDir()
	shard := filepath.Join(dir, "shard-000000.tar")
	writeFile(t, shard, tarBytes(t, good))

	d := drain(t, shard, Options{MaxImageBytes: 10})
	wantSamples := []struct{ id, text, img, name string }{
		{"sub/000001", "caption one", "img1", "000001.jpg"},
		{"custom-2", "from json", "img2", "000002.png"},
		{"000003", "txt wins", "img3", "000003.jpg"},
		{"a", "key up to first dot", "img10", "a.b.c.jpg"},
	}
	if len(d.samples) != len(wantSamples) {
		t.Fatalf("got %d samples %v, want %d", len(d.samples), ids(d.samples), len(wantSamples))
	}
	for i, w := range wantSamples {
		s := d.samples[i]
		if s.ID != w.id || s.Text != w.text || string(s.Image) != w.img || s.ImageName != w.name {
			t.Errorf("sample %d: got %+v, want %+v", i, s, w)
		}
	}
	wantRejects := map[string]string{
		shard + ":000004": ReasonMissingCaption,
		shard + ":000005": ReasonMissingImage,
		shard + ":000006": ReasonTooLarge,
		shard + ":000007": ReasonEmptyImage,
		shard + ":000008": ReasonEmptyCaption,
		shard + ":000009": ReasonBadCaption,
	}
	got := reasonsByLoc(d.rejects)
	for _, loc := range sortedKeys(wantRejects) {
		if got[loc] != wantRejects[loc] {
			t.Errorf("%s: got reason %q, want %q", loc, got[loc], wantRejects[loc])
		}
	}
	if len(got) != len(wantRejects) {
		t.Errorf("got rejects %v, want %v", got, wantRejects)
	}
}

func TestTarBroken(t *testing.T) {
	full := tarBytes(t, []member{
		{"000001.jpg", "img1"}, {"000001.txt", "one"},
		{"000002.jpg", string(bytes.Repeat([]byte{7}, 2000))}, {"000002.txt", "two"},
		{"000003.jpg", "img3"}, {"000003.txt", "three"},
	})
	dir := t.TempDir()
	tests := []struct {
		name        string
		data        []byte
		wantEmitted int
	}{
		{"truncated in member data", full[:512*3+1000], 1},
		{"garbage after first group", append(append([]byte{}, full[:512*4]...), bytes.Repeat([]byte("x"), 1024)...), 1},
		{"not a tar", []byte("this is not a tar archive at all, just some text that is long enough"), 0},
		{"empty file", nil, 0},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad := filepath.Join(dir, "bad"+string(rune('a'+i))+".tar")
			writeFile(t, bad, tt.data)
			d := drain(t, bad, Options{})
			if len(d.samples) != tt.wantEmitted {
				t.Errorf("emitted %d, want %d", len(d.samples), tt.wantEmitted)
			}
			if len(tt.data) > 0 && d.stats.ByReason[ReasonBrokenTar] == 0 {
				t.Errorf("no broken_tar reject: %+v", d.rejects)
			}
		})
	}
}

func TestTarShardsFolderAndGlob(t *testing.T) {
	dir := t.TempDir()
	for s := range 3 {
		var ms []member
		for k := range 4 {
			key := string(rune('a'+s)) + string(rune('0'+k))
			ms = append(ms, member{key + ".jpg", "img-" + key}, member{key + ".txt", "caption " + key})
		}
		writeFile(t, filepath.Join(dir, "shard-"+string(rune('0'+s))+".tar"), tarBytes(t, ms))
	}
	writeFile(t, filepath.Join(dir, "README.md"), []byte("ignored"))
	for _, path := range []string{dir, filepath.Join(dir, "shard-*.tar")} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			d := drain(t, path, Options{})
			got := ids(d.samples)
			if len(got) != 12 || got[0] != "a0" || got[4] != "b0" || got[11] != "c3" {
				t.Errorf("got ids %v, want a0..c3 in shard order", got)
			}
		})
	}
}

// FuzzTarSource feeds arbitrary bytes as a shard. Run with a short
// -fuzzminimizetime (e.g. 2s): minimizing tar inputs is slow.
func FuzzTarSource(f *testing.F) {
	f.Add(tarBytes(f, []member{{"1.jpg", "i"}, {"1.txt", "t"}, {"2.json", `{"caption":"c"}`}, {"2.png", "p"}}))
	f.Add(tarBytes(f, []member{{"x.jpg", "i"}})[:700])
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := newTarSource([]string{"f.tar"}, Options{MaxImageBytes: 1 << 16, MaxCaptionBytes: 1 << 16}.withDefaults())
		src.open = func(string, string) (io.ReadSeekCloser, error) { return nopCloser{bytes.NewReader(data)}, nil }
		defer src.Close()
		n := 0
		for {
			s, err := src.Next(context.Background())
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			if len(s.Image) == 0 || CheckCaption(s.Text) != "" {
				t.Errorf("emitted a bad sample %+v", s)
			}
			n++
		}
		st := src.Stats()
		if st.Seen != st.Emitted+st.Quarantined || st.Emitted != int64(n) {
			t.Errorf("stats %+v, emitted %d", st, n)
		}
	})
}

type nopCloser struct{ io.ReadSeeker }

func (nopCloser) Close() error { return nil }

// TestTarKeys checks configurable member extensions: image keys, caption keys
// in priority order, JSON fields (nested), and the id of a JSON member that
// does not give the caption.
func TestTarKeys(t *testing.T) {
	shard := filepath.Join(t.TempDir(), "s.tar")
	writeFile(t, shard, tarBytes(t, []member{
		{"1.tif", "img1"}, {"1.json", `{"meta":{"alt":"nested alt"},"id":"one"}`},
		{"2.tif", "img2"}, {"2.cap", "cap wins"}, {"2.json", `{"meta":{"alt":"alt"}}`},
		{"3.jpg", "not an image key"}, {"3.cap", "c3"},
		{"4.tif", "img4"}, {"4.json", `{"caption":"caption is no key here"}`},
		{"5.tif", "img5"}, {"5.json", `{"meta":{"alt":"5"},"id":"five"}`}, {"5.cap", "cap after json"},
	}))
	d := drain(t, shard, Options{WDSImageKeys: "tif", WDSTextKeys: "cap;json:meta.alt"})
	want := []string{"one:nested alt", "2:cap wins", "five:cap after json"}
	var got []string
	for _, s := range d.samples {
		got = append(got, s.ID+":"+s.Text)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("samples %q, want %q", got, want)
	}
	rej := reasonsByLoc(d.rejects)
	if rej[shard+":3"] != ReasonMissingImage || rej[shard+":4"] != ReasonMissingCaption || len(rej) != 2 {
		t.Errorf("rejects %v, want 3 missing_image, 4 missing_caption", rej)
	}
	for _, bad := range []Options{{WDSImageKeys: "jpg;;png"}, {WDSTextKeys: "jpg"}, {WDSImageKeys: "a:b"}} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: got %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// TestTarDuplicateKey: a sample whose key repeats right after itself (a
// member name written twice) is quarantined as duplicate_id at its own
// location, key#2, key#3, ..., in Next and in Scan alike, never dropped
// without a quarantine line; the first copy is delivered.
func TestTarDuplicateKey(t *testing.T) {
	for _, c := range []struct {
		name    string
		members []member
		samples string
		rejects []string // locations (after the shard path) of duplicate_id rejects
	}{
		{"pair twice", []member{{"a.jpg", "i1"}, {"a.txt", "one"}, {"a.jpg", "i2"}, {"a.txt", "two"}, {"b.jpg", "i"}, {"b.txt", "b"}},
			"a,b", []string{":a#2"}},
		{"three times", []member{{"a.jpg", "i1"}, {"a.txt", "one"}, {"a.jpg", "i2"}, {"a.txt", "two"}, {"a.jpg", "i3"}, {"a.txt", "three"}},
			"a", []string{":a#2", ":a#3"}},
		{"caption twice", []member{{"a.jpg", "i1"}, {"a.txt", "one"}, {"a.txt", "two"}}, "a", []string{":a#2"}},
		{"in a folder", []member{{"x/a.jpg", "i1"}, {"x/a.txt", "one"}, {"x/a.jpg", "i2"}}, "x/a", []string{":x/a#2"}},
		{"two image kinds are one sample", []member{{"a.jpg", "i1"}, {"a.png", "i2"}, {"a.txt", "one"}}, "a", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "s.tar")
			writeFile(t, p, tarBytes(t, c.members))
			for _, scan := range []bool{false, true} {
				var d drained
				if scan {
					d = scanWithin(t, 10*time.Second, p, Options{})
				} else {
					d = drain(t, p, Options{})
				}
				var got []string
				for _, r := range d.rejects {
					if r.Reason != ReasonDuplicateID || r.Detail == "" {
						t.Errorf("scan=%v: reject %+v, want duplicate_id with a detail", scan, r)
					}
					got = append(got, strings.TrimPrefix(r.Location, p))
				}
				if ids := strings.Join(ids(d.samples), ","); ids != c.samples || strings.Join(got, ",") != strings.Join(c.rejects, ",") {
					t.Errorf("scan=%v: got samples %s, rejects %v; want %s, %v", scan, ids, got, c.samples, c.rejects)
				}
			}
		})
	}
}
