package loader

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
	"unsafe"
)

func TestParseKeep(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want []KeepField
		err  bool
	}{
		{"", nil, false},
		{"url,json:label,caption", []KeepField{{"url", KeepKey, "url"}, {"label", KeepPath, "label"}, {"caption", KeepCaption, ""}}, false},
		{" json:meta.src , lbl=json:a.b", []KeepField{{"meta.src", KeepPath, "meta.src"}, {"lbl", KeepPath, "a.b"}}, false},
		{"a.b", []KeepField{{"a.b", KeepKey, "a.b"}}, false},
		{"url,json:url", nil, true}, // both named url
		{"json:", nil, true},
		{"json:a..b", nil, true},
		{"json:.a", nil, true},
		{"bad name=url", nil, true},
		{"x/y", nil, true},
		{"url,,caption", nil, true},
		{strings.Repeat("k", 65), nil, true},
	} {
		got, err := ParseKeep(tc.spec)
		if (err != nil) != tc.err || !tc.err && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseKeep(%q) = %+v, %v; want %+v (error %v)", tc.spec, got, err, tc.want, tc.err)
		}
		if err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ParseKeep(%q): %v, want ErrInvalidConfig", tc.spec, err)
		}
	}
}

// TestExtractKeep: every value, hostile ones included, becomes a value or a
// missing one, never an error.
func TestExtractKeep(t *testing.T) {
	fields, err := ParseKeep("url,json:label,json:meta.w,caption,obj=json:meta")
	if err != nil {
		t.Fatal(err)
	}
	v := func(s string) KeepValue { return KeepValue{Text: s, Valid: true} }
	n := func(s string) KeepValue { return KeepValue{Text: s, Num: true, Valid: true} }
	long := strings.Repeat("é", MaxKeepBytes) // 2 bytes a rune: cut on a rune boundary
	for _, tc := range []struct {
		name, raw, caption string
		want               []KeepValue
	}{
		{"img2dataset", `{"url":"http://x/1.jpg","label":3,"meta":{"w":0.5}}`, "a cat",
			[]KeepValue{v("http://x/1.jpg"), n("3"), n("0.5"), v("a cat"), v(`{"w":0.5}`)}},
		{"missing and null", `{"label":null}`, "c", []KeepValue{{}, {}, {}, v("c"), {}}},
		{"path through a string", `{"meta":"flat","url":7}`, "c", []KeepValue{n("7"), {}, {}, v("c"), v("flat")}},
		{"bool and array", `{"url":true,"label":[1, 2]}`, "c", []KeepValue{v("true"), v("[1,2]"), {}, v("c"), {}}},
		{"not JSON", `{"url":`, "c", []KeepValue{{}, {}, {}, v("c"), {}}},
		{"no JSON", ``, "c", []KeepValue{{}, {}, {}, v("c"), {}}},
		{"a JSON array line", `[1,2]`, "c", []KeepValue{{}, {}, {}, v("c"), {}}},
		{"invalid UTF-8", "{\"url\":\"a\xffb\"}", "x\xfe", []KeepValue{v("a\uFFFDb"), {}, {}, v("x\uFFFD"), {}}},
		{"escaped NUL", `{"url":"a\u0000b"}`, "c", []KeepValue{v("a\x00b"), {}, {}, v("c"), {}}},
		{"long", `{"url":"` + long + `"}`, "c", []KeepValue{v(long[:MaxKeepBytes]), {}, {}, v("c"), {}}},
		{"big number", `{"label":123456789012345678901234567890}`, "c", []KeepValue{{}, n("123456789012345678901234567890"), {}, v("c"), {}}},
	} {
		got := extractKeep(fields, []byte(tc.raw), tc.caption)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestKeepTypes(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals []string // raw JSON values, "" for absent
		want KeepType
		miss int64
	}{
		{"ints", []string{"1", "-2", ""}, KeepInt, 1},
		{"ints and floats", []string{"1", "2.5"}, KeepFloat, 0},
		{"exponent", []string{"1e3"}, KeepFloat, 0},
		{"over int64", []string{"1", "99999999999999999999"}, KeepFloat, 0},
		{"numbers and a string", []string{"1", `"N/A"`, "2.5"}, KeepString, 0},
		{"bool", []string{"1", "true"}, KeepString, 0},
		{"all missing", []string{"", "null"}, KeepString, 2},
	} {
		tb := newKeepTable([]KeepField{{"x", KeepKey, "x"}})
		for _, raw := range tc.vals {
			line := `{}`
			if raw != "" {
				line = `{"x":` + raw + `}`
			}
			ref := tb.add(extractKeep(tb.fields, []byte(line), ""))
			if got := tb.values(ref); len(got) != 1 || got[0] != keepValueOf([]byte(raw)) {
				t.Errorf("%s: row %d decodes to %+v", tc.name, ref, got)
			}
		}
		if tb.types[0] != tc.want || tb.missing[0] != tc.miss {
			t.Errorf("%s: type %v, %d missing; want %v, %d", tc.name, tb.types[0], tb.missing[0], tc.want, tc.miss)
		}
	}
}

// TestScanKeeps reads kept fields from an img2dataset-style WebDataset shard
// (url and a label in each sample's .json, the caption in .txt) and from a
// manifest, and checks the kept values cost the entries no memory.
func TestScanKeeps(t *testing.T) {
	dir := t.TempDir()
	shard := filepath.Join(dir, "shard-000000.tar")
	writeFile(t, shard, tarBytes(t, []member{
		{"000000.jpg", "img0"}, {"000000.txt", "cap zero"}, {"000000.json", `{"url":"http://e/0.jpg","label":4,"key":"000000"}`},
		{"000001.jpg", "img1"}, {"000001.txt", "cap one"}, {"000001.json", `{"url":"http://e/1.jpg"}`},
		{"000002.jpg", "img2"}, {"000002.txt", "cap two"}, {"000002.json", `{"url":`},
		{"000003.jpg", "img3"}, {"000003.txt", "cap three"},
	}))
	manifest := filepath.Join(dir, "m.jsonl")
	writeFile(t, filepath.Join(dir, "a.jpg"), []byte("img"))
	writeFile(t, manifest, []byte(`{"image":"a.jpg","text":"t0","url":"u0","label":1.5}`+"\n"+
		`{"image":"a.jpg","text":"t1","label":2}`+"\n"))
	fields, err := ParseKeep("url,json:label,caption")
	if err != nil {
		t.Fatal(err)
	}
	v := func(s string) KeepValue { return KeepValue{Text: s, Valid: true} }
	n := func(s string) KeepValue { return KeepValue{Text: s, Num: true, Valid: true} }
	for _, tc := range []struct {
		name, path, textKeys string
		want                 [][]KeepValue
		types                []KeepType
		missing              []int64
	}{
		// default text keys read .json for captions: a broken one is a bad_caption reject, as without --keep
		{"wds", shard, "", [][]KeepValue{{v("http://e/0.jpg"), n("4"), v("cap zero")}, {v("http://e/1.jpg"), {}, v("cap one")},
			{{}, {}, v("cap three")}}, []KeepType{KeepString, KeepInt, KeepString}, []int64{1, 2, 0}},
		{"wds json not a text key", shard, "txt", [][]KeepValue{{v("http://e/0.jpg"), n("4"), v("cap zero")}, {v("http://e/1.jpg"), {}, v("cap one")},
			{{}, {}, v("cap two")}, {{}, {}, v("cap three")}}, []KeepType{KeepString, KeepInt, KeepString}, []int64{2, 3, 0}},
		{"manifest", manifest, "", [][]KeepValue{{v("u0"), n("1.5"), v("t0")}, {{}, n("2"), v("t1")}},
			[]KeepType{KeepString, KeepFloat, KeepString}, []int64{1, 0, 0}},
	} {
		opts := DefaultOptions()
		opts.Keep = fields
		if tc.textKeys != "" {
			opts.WDSTextKeys = tc.textKeys
		}
		ix, err := BuildIndex(context.Background(), tc.path, opts)
		if err != nil {
			t.Fatal(err)
		}
		var got [][]KeepValue
		for _, e := range ix.All() {
			got = append(got, ix.Kept(e))
		}
		if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(ix.KeepTypes(), tc.types) || !reflect.DeepEqual(ix.KeepMissing(), tc.missing) {
			t.Errorf("%s: kept %+v types %v missing %v;\nwant %+v types %v missing %v", tc.name, got, ix.KeepTypes(), ix.KeepMissing(), tc.want, tc.types, tc.missing)
		}
		for _, e := range ix.Order(1, 0) { // entries travel by value: an order's copies find their values
			if k := ix.Kept(e); len(k) != 3 || k[2].Text != e.Text {
				t.Errorf("%s: ordered entry %s kept %+v, want its caption %q last", tc.name, e.ID, k, e.Text)
			}
		}
		must(t, ix.Close())
	}
	if got := unsafe.Sizeof(Entry{}); got != 128 {
		t.Errorf("Entry is %d bytes, want 128 (the keep row fills imageRef's padding)", got)
	}
}

// FuzzExtractKeep: any JSON member or line gives one value per field, valid
// UTF-8, at most MaxKeepBytes, that the table stores and decodes unchanged.
func FuzzExtractKeep(f *testing.F) {
	for _, s := range []string{`{"url":"http://x","label":3,"meta":{"w":0.5}}`, `{"url":`, `[1]`, "{\"url\":\"\xff\"}", `{"meta":"x"}`, ``} {
		f.Add([]byte(s), "caption")
	}
	fields, err := ParseKeep("url,json:label,json:meta.w,caption")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw []byte, caption string) {
		vals := extractKeep(fields, raw, caption)
		if len(vals) != len(fields) {
			t.Fatalf("%d values for %d fields", len(vals), len(fields))
		}
		for _, v := range vals {
			if !utf8.ValidString(v.Text) || len(v.Text) > MaxKeepBytes || !v.Valid && v.Text != "" {
				t.Fatalf("value %+v", v)
			}
		}
		tb := newKeepTable(fields)
		if got := tb.values(tb.add(vals)); !reflect.DeepEqual(got, vals) {
			t.Fatalf("stored %+v, decoded %+v", vals, got)
		}
	})
}
