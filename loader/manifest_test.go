package loader

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestParseManifestLine(t *testing.T) {
	tests := []struct {
		name, line string
		want       manifestLine
		reason     string
	}{
		{"full", `{"image":"a.jpg","text":"a cat","id":"x1"}`, manifestLine{Image: "a.jpg", Text: "a cat", ID: "x1"}, ""},
		{"caption alias", `{"image":"a.jpg","caption":"a dog"}`, manifestLine{Image: "a.jpg", Text: "a dog"}, ""},
		{"numeric id", `{"image":"a.jpg","text":"t","id":42}`, manifestLine{Image: "a.jpg", Text: "t", ID: "42"}, ""},
		{"extra fields", `{"image":"a.jpg","text":"t","w":3}`, manifestLine{Image: "a.jpg", Text: "t"}, ""},
		{"crlf", "{\"image\":\"a.jpg\",\"text\":\"t\"}\r", manifestLine{Image: "a.jpg", Text: "t"}, ""},
		{"not json", `image=a.jpg`, manifestLine{}, ReasonBadManifestLine},
		{"array", `["a.jpg","t"]`, manifestLine{}, ReasonBadManifestLine},
		{"truncated", `{"image":"a.jpg","text":"t`, manifestLine{}, ReasonBadManifestLine},
		{"no image", `{"text":"t"}`, manifestLine{}, ReasonMissingImage},
		{"null image", `{"image":null,"text":"t"}`, manifestLine{}, ReasonMissingImage},
		{"image number", `{"image":3,"text":"t"}`, manifestLine{}, ReasonBadManifestLine},
		{"no text", `{"image":"a.jpg"}`, manifestLine{Image: "a.jpg"}, ReasonMissingCaption},
		{"text object", `{"image":"a.jpg","text":{"en":"t"}}`, manifestLine{Image: "a.jpg"}, ReasonBadManifestLine},
		{"id object", `{"image":"a.jpg","text":"t","id":{}}`, manifestLine{}, ReasonBadManifestLine},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, reason, _ := parseManifestLine([]byte(tt.line))
			if reason != tt.reason {
				t.Fatalf("reason: got %q, want %q", reason, tt.reason)
			}
			if tt.reason == "" && got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseManifestFields(t *testing.T) {
	hf := manifestFields{image: "file_name", text: "caption", id: "meta.key"}
	nested := manifestFields{image: "image.path", text: "texts.en", id: "id"}
	tests := []struct {
		name, line string
		fields     manifestFields
		want       manifestLine
		reason     string
	}{
		{"renamed", `{"file_name":"a.jpg","caption":"a cat","meta":{"key":7}}`, hf, manifestLine{Image: "a.jpg", Text: "a cat", ID: "7"}, ""},
		{"renamed, text absent", `{"file_name":"a.jpg","text":"a cat"}`, hf, manifestLine{}, ReasonMissingCaption},
		{"nested", `{"image":{"path":"x/b.png"},"texts":{"en":"a dog"},"id":"q"}`, nested, manifestLine{Image: "x/b.png", Text: "a dog", ID: "q"}, ""},
		{"dotted key first", `{"image.path":"c.jpg","image":{"path":"d.jpg"},"texts":{"en":"t"}}`, nested, manifestLine{Image: "c.jpg", Text: "t"}, ""},
		{"path through a string", `{"image":"e.jpg","texts":{"en":"t"}}`, nested, manifestLine{}, ReasonMissingImage},
		{"path to an object", `{"image":{"path":{"p":1}},"texts":{"en":"t"}}`, nested, manifestLine{}, ReasonBadManifestLine},
		{"defaults spelled out", `{"image":"a.jpg","caption":"c"}`, manifestFields{"image", "text", "id"}, manifestLine{Image: "a.jpg", Text: "c"}, ""},
		{"not json", `{"file_name":`, hf, manifestLine{}, ReasonBadManifestLine},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, reason, _ := parseManifestFields([]byte(tt.line), tt.fields)
			if reason != tt.reason {
				t.Fatalf("reason: got %q, want %q", reason, tt.reason)
			}
			if tt.reason == "" && got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestManifestRoot checks that --root moves where relative paths resolve and
// what they may not leave, and that absolute paths need AllowAbsolute.
func TestManifestRoot(t *testing.T) {
	dir := t.TempDir()
	data, lists := filepath.Join(dir, "data"), filepath.Join(dir, "lists")
	writeFile(t, filepath.Join(data, "imgs", "a.jpg"), []byte("jpeg"))
	writeFile(t, filepath.Join(dir, "outside.jpg"), []byte("jpeg"))
	abs := filepath.Join(data, "imgs", "a.jpg")
	lines := []string{
		`{"image":"imgs/a.jpg","text":"relative to the root","id":"rel"}`,
		`{"image":"../outside.jpg","text":"leaves the root","id":"out"}`,
		`{"image":` + strconv.Quote(abs) + `,"text":"absolute","id":"abs"}`,
	}
	manifest := filepath.Join(lists, "train.jsonl")
	writeFile(t, manifest, []byte(strings.Join(lines, "\n")+"\n"))
	tests := []struct {
		name     string
		opts     Options
		want     []string
		rejected map[string]string
	}{
		{"manifest folder", Options{}, nil, map[string]string{"rel": ReasonMissingImage, "out": ReasonEscapesRoot, "abs": ReasonEscapesRoot}},
		{"root", Options{Root: data}, []string{"rel"}, map[string]string{"out": ReasonEscapesRoot, "abs": ReasonEscapesRoot}},
		{"root and absolute", Options{Root: data, AllowAbsolute: true}, []string{"rel", "abs"}, map[string]string{"out": ReasonEscapesRoot}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := drain(t, manifest, tt.opts)
			if got := ids(d.samples); strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("samples %v, want %v", got, tt.want)
			}
			got := map[string]string{}
			for _, r := range d.rejects {
				got[r.ID] = r.Reason
			}
			if len(got) != len(tt.rejected) {
				t.Errorf("rejects %v, want %v", got, tt.rejected)
			}
			for id, reason := range tt.rejected {
				if got[id] != reason {
					t.Errorf("%s: reason %q, want %q", id, got[id], reason)
				}
			}
		})
	}
}

func FuzzManifestLine(f *testing.F) {
	for _, s := range []string{`{"img":{"p":"a.jpg"},"cap":"t","k":{"v":2}}`, `{"image":"a.jpg","text":"t","id":"1"}`, `{"image":1}`, `[]`, `{"image":"../x","caption":"\u0000"}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		got, reason, detail := parseManifestLine(line)
		if reason == "" {
			if got.Image == "" {
				t.Errorf("accepted a line without image: %q", line)
			}
			return
		}
		if detail == "" {
			t.Errorf("reason %q without detail for %q", reason, line)
		}
		_ = CheckCaption(got.Text)
		// Named, nested fields: the same contract.
		got, reason, detail = parseManifestFields(line, manifestFields{image: "img.p", text: "cap", id: "k.v"})
		if (reason == "" && got.Image == "") || (reason != "" && detail == "") {
			t.Errorf("named fields: got %+v, reason %q, detail %q for %q", got, reason, detail, line)
		}
	})
}

// TestManifestBOM: a UTF-8 byte order mark at the start of a manifest is
// skipped (its first sample is delivered, not quarantined as
// bad_manifest_line); one on a later line is no BOM of the file and stays.
func TestManifestBOM(t *testing.T) {
	const line = `{"image":"img/ok.jpg","text":"a cat","id":"ok"}`
	for _, c := range []struct {
		name, content string
		ids           []string
		rejects       int
	}{
		{"bom then line", "\ufeff" + line + "\n", []string{"ok"}, 0},
		{"bom alone on the first line", "\ufeff\n" + line + "\n", []string{"ok"}, 0},
		{"no bom", line + "\n", []string{"ok"}, 0},
		{"bom on line 2", `{"image":"img/ok.jpg","text":"first","id":"a"}` + "\n\ufeff" + line + "\n", []string{"a"}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			manifest := manifestFixture(t, nil)
			writeFile(t, manifest, []byte(c.content))
			d := drain(t, manifest, Options{})
			if got := strings.Join(ids(d.samples), ","); got != strings.Join(c.ids, ",") || len(d.rejects) != c.rejects {
				t.Errorf("got samples %s, rejects %v; want %v and %d rejects", got, d.rejects, c.ids, c.rejects)
			}
		})
	}
}

// FuzzManifestSource feeds arbitrary bytes as a manifest: the source never
// panics, keeps its counters, emits only samples with image bytes, and a
// byte order mark in front changes nothing.
func FuzzManifestSource(f *testing.F) {
	for _, s := range []string{`{"image":"img/ok.jpg","text":"t"}`, "\ufeff{\"image\":\"img/ok.jpg\",\"text\":\"t\"}\n\n{}",
		`{"image":"../x","text":"t"}` + "\n" + `{"image":"img/ok.jpg","caption":"c","id":3}`, "", "\ufeff"} {
		f.Add([]byte(s))
	}
	manifest := manifestFixture(f, nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		run := func(content []byte) string {
			writeFile(t, manifest, content)
			d := drain(t, manifest, Options{MaxImageBytes: 50, MaxCaptionBytes: 1 << 10})
			for _, s := range d.samples {
				if len(s.Image) == 0 {
					t.Errorf("emitted a sample without image bytes: %+v", s)
				}
			}
			var out []string
			for _, r := range d.rejects {
				out = append(out, r.Location+" "+r.Reason)
			}
			return strings.Join(ids(d.samples), ",") + "|" + strings.Join(out, ",")
		}
		plain := run(data)
		if withBOM := run(append([]byte("\ufeff"), data...)); withBOM != plain && !bytes.HasPrefix(data, []byte("\ufeff")) {
			t.Errorf("a BOM in front changed the result: %s, without %s", withBOM, plain)
		}
	})
}

func TestCheckCaption(t *testing.T) {
	tests := []struct{ name, text, want string }{
		{"plain", "a cat on a mat", ""},
		{"multi-script", "東京の猫 🐈 Ελλάδα", ""},
		{"some invalid utf8", "a cat \xff on a mat", ""},
		{"tabs and newlines", "line one\n\tline two\r\n", ""},
		{"empty", "", ReasonEmptyCaption},
		{"whitespace", " \t\n ", ReasonEmptyCaption},
		{"nul", "a\x00b", ReasonBinaryCaption},
		{"mostly invalid", "\xff\xfe\xfd\xfc ab", ReasonBinaryCaption},
		{"control chars", "\x01\x02\x03\x04abc", ReasonBinaryCaption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CheckCaption(tt.text); got != tt.want {
				t.Errorf("CheckCaption(%q) = %q, want %q", tt.text, got, tt.want)
			}
		})
	}
}

// manifestFixture builds a manifest folder with one line per case and
// returns the manifest path.
func manifestFixture(t testing.TB, lines []string) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "data")
	outside := filepath.Join(dir, "outside")
	writeFile(t, filepath.Join(root, "img", "ok.jpg"), []byte("jpegbytes"))
	writeFile(t, filepath.Join(root, "img", "big.jpg"), bytes.Repeat([]byte{1}, 100))
	writeFile(t, filepath.Join(root, "img", "zero.jpg"), nil)
	writeFile(t, filepath.Join(outside, "secret.jpg"), []byte("secret"))
	must(t, os.Symlink(filepath.Join(outside, "secret.jpg"), filepath.Join(root, "img", "escape.jpg")))
	must(t, os.Symlink(outside, filepath.Join(root, "linkdir")))
	must(t, os.Symlink(filepath.Join(root, "img", "ok.jpg"), filepath.Join(root, "img", "inside.jpg")))
	must(t, os.Mkdir(filepath.Join(root, "img", "adir.jpg"), 0o755))
	manifest := filepath.Join(root, "manifest.jsonl")
	writeFile(t, manifest, []byte(strings.Join(lines, "\n")))
	return manifest
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestManifestSource(t *testing.T) {
	secret := "" // filled with the absolute path of outside/secret.jpg
	cases := []struct {
		line   string
		reason string // "" = emitted
		opts   func(*Options)
	}{
		{line: `{"image":"img/ok.jpg","text":"a cat","id":"ok"}`},
		{line: `{"image":"img/inside.jpg","text":"linked inside"}`},
		{line: ``}, // blank lines are skipped, not counted
		{line: `{"image":"img/missing.jpg","text":"t"}`, reason: ReasonMissingImage},
		{line: `{"image":"../outside/secret.jpg","text":"t"}`, reason: ReasonEscapesRoot},
		{line: `{"image":"img/escape.jpg","text":"t"}`, reason: ReasonEscapesRoot},
		{line: `{"image":"linkdir/secret.jpg","text":"t"}`, reason: ReasonEscapesRoot},
		{line: `{"image":"ABS","text":"t"}`, reason: ReasonEscapesRoot},
		{line: `{"image":"img/zero.jpg","text":"t"}`, reason: ReasonEmptyImage},
		{line: `{"image":"img/big.jpg","text":"t"}`, reason: ReasonTooLarge},
		{line: `{"image":"img/adir.jpg","text":"t"}`, reason: ReasonNotRegular},
		{line: `{"image":"img/ok.jpg","text":"  "}`, reason: ReasonEmptyCaption},
		{line: `{"image":"img/ok.jpg","text":"\u0000\u0001"}`, reason: ReasonBinaryCaption},
		{line: `{"image":"img/ok.jpg"}`, reason: ReasonMissingCaption},
		{line: `not json at all`, reason: ReasonBadManifestLine},
		{line: `{"image":"img/ok.jpg","text":"` + strings.Repeat("x", 200) + `"}`, reason: ReasonTooLarge},
	}
	lines := make([]string, len(cases))
	for i, c := range cases {
		lines[i] = c.line
	}
	manifest := manifestFixture(t, lines)
	secret = filepath.Join(filepath.Dir(filepath.Dir(manifest)), "outside", "secret.jpg")
	for i := range lines {
		lines[i] = strings.Replace(lines[i], "ABS", filepath.ToSlash(secret), 1)
	}
	writeFile(t, manifest, []byte(strings.Join(lines, "\n")))

	d := drain(t, manifest, Options{MaxImageBytes: 50, MaxCaptionBytes: 100})
	got := reasonsByLoc(d.rejects)
	for i, c := range cases {
		loc := manifest + ":" + strconv.Itoa(i+1)
		if c.reason == "" {
			continue
		}
		if got[loc] != c.reason {
			t.Errorf("line %d %s: got reason %q, want %q", i+1, c.line, got[loc], c.reason)
		}
	}
	if len(d.samples) != 2 {
		t.Fatalf("emitted %d samples, want 2: %+v", len(d.samples), d.samples)
	}
	if s := d.samples[0]; s.ID != "ok" || string(s.Image) != "jpegbytes" || s.Location != manifest+":1" || s.ImageName != "ok.jpg" {
		t.Errorf("sample 0: got %+v", s)
	}
	if s := d.samples[1]; s.ID != DeriveID("manifest.jsonl", "img/inside.jpg\nlinked inside") || string(s.Image) != "jpegbytes" {
		t.Errorf("sample 1: got %+v", s)
	}
}

func TestManifestAllowAbsolute(t *testing.T) {
	dir := t.TempDir()
	abs := filepath.Join(dir, "elsewhere", "a.png")
	writeFile(t, abs, []byte("png"))
	manifest := filepath.Join(dir, "m", "manifest.jsonl")
	writeFile(t, manifest, []byte(`{"image":"`+filepath.ToSlash(abs)+`","text":"abs"}`+"\n"))
	tests := []struct {
		allow       bool
		wantEmitted int
	}{{false, 0}, {true, 1}}
	for _, tt := range tests {
		t.Run("allow="+strconv.FormatBool(tt.allow), func(t *testing.T) {
			d := drain(t, manifest, Options{AllowAbsolute: tt.allow})
			if len(d.samples) != tt.wantEmitted {
				t.Errorf("got %d samples, want %d (rejects %+v)", len(d.samples), tt.wantEmitted, d.rejects)
			}
		})
	}
}

func TestManifestIDsStable(t *testing.T) {
	manifest := manifestFixture(t, []string{
		`{"image":"img/ok.jpg","text":"one"}`,
		`{"image":"img/ok.jpg","text":"two"}`,
	})
	a, b := drain(t, manifest, Options{}), drain(t, manifest, Options{})
	if got, want := ids(a.samples), ids(b.samples); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("ids differ between runs: %v vs %v", got, want)
	}
	if a.samples[0].ID == a.samples[1].ID {
		t.Errorf("two captions of one image share id %s", a.samples[0].ID)
	}
}

func TestManifestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		path string
		opts Options
		want error
	}{
		{"missing file", filepath.Join(dir, "nope.jsonl"), Options{}, os.ErrNotExist},
		{"unknown ext", writeTemp(t, dir, "x.csv"), Options{}, ErrUnknownFormat},
		{"bad format", dir, Options{Format: "csv"}, ErrInvalidConfig},
		{"negative cap", dir, Options{MaxImageBytes: -1}, ErrInvalidConfig},
		{"empty glob", filepath.Join(dir, "*.tar"), Options{}, ErrNoData},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Open(tt.path, tt.opts)
			if !errors.Is(err, tt.want) {
				t.Errorf("Open: got %v, want %v", err, tt.want)
			}
		})
	}
}

func writeTemp(t *testing.T, dir, name string) string {
	p := filepath.Join(dir, name)
	writeFile(t, p, []byte("x"))
	return p
}

func TestManifestGlob(t *testing.T) {
	dir := t.TempDir()
	for _, part := range []string{"a", "b"} {
		writeFile(t, filepath.Join(dir, part, "img.jpg"), []byte("img-"+part))
		writeFile(t, filepath.Join(dir, part, "part-"+part+".jsonl"),
			[]byte(`{"image":"img.jpg","text":"from `+part+`","id":"`+part+`"}`+"\n"+`{"image":"gone.jpg","text":"x"}`+"\n"))
	}
	d := drain(t, filepath.Join(dir, "*", "part-*.jsonl"), Options{})
	if got := ids(d.samples); len(got) != 2 || got[0] != "a" || got[1] != "b" || string(d.samples[1].Image) != "img-b" {
		t.Errorf("got %v, want [a b] with each manifest's own image", got)
	}
	if d.stats.ByReason[ReasonMissingImage] != 2 {
		t.Errorf("got stats %+v, want 2 missing_image", d.stats)
	}
}

func TestManifestLongLine(t *testing.T) {
	manifest := manifestFixture(t, []string{
		`{"image":"img/ok.jpg","text":"` + strings.Repeat("long ", 20000) + `"}`,
		`{"image":"img/ok.jpg","text":"after the long line"}`,
	})
	d := drain(t, manifest, Options{MaxCaptionBytes: 1000})
	if len(d.samples) != 1 || d.samples[0].Location != manifest+":2" {
		t.Fatalf("got %+v, want only line 2", d.samples)
	}
	if len(d.rejects) != 1 || d.rejects[0].Reason != ReasonTooLarge || d.rejects[0].Location != manifest+":1" {
		t.Errorf("got rejects %+v, want too_large at line 1", d.rejects)
	}
}
