package loader

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// Kept fields (Options.Keep, the --keep flag) are source fields carried
// into the batches beside the tensors.
//
// Syntax: a comma-separated list of specs, each [NAME=]FIELD:
//
//   - "caption": the sample's text as the source read it (every source);
//   - "url" (any bare name): a top-level key of the sample's JSON object,
//     taken literally (dots included): the manifest line, the .json
//     member of a WebDataset sample (img2dataset writes "url", "key",
//     "status", "caption", ... there), a Parquet or Arrow (HF
//     save_to_disk) row's columns of those names (parquetkeep.go: a struct
//     column is an object), or an image folder's metadata.jsonl/csv row
//     (folder_meta.go: a CSV value is a string);
//   - "json:a.b": a dotted path into that same JSON object ("json:url" is
//     "url").
//
// NAME is the column's name (default: FIELD, and for json:a.b the path
// "a.b"); names are unique, 1 to 64 bytes of [A-Za-z0-9_.-].
//
// Values: a JSON string is kept as text (invalid UTF-8 repaired to U+FFFD),
// a JSON number as its number text, true/false as text, an object or array
// as its compact JSON text, and null, an absent key, a path through a
// non-object, an unparsable JSON member or a sample without JSON (an image
// folder's image with a sidecar .txt and no metadata row: only "caption"
// there) as missing. A missing value is never
// a reject: it is null in its column and counted (Index.KeepMissing). Values
// are cut at MaxKeepBytes (at a rune boundary).
//
// Types: Scan gives each field one type for the whole index (KeepTypes):
// int when every present value is a JSON integer that fits int64, float
// when every present value is a JSON number, else string (a mix of numbers
// and strings is a string column, the numbers as their text). A field with
// no present value is a string column of nulls.

// MaxKeepBytes bounds one kept value.
const MaxKeepBytes = 4096

// KeepKind says where a kept field comes from.
type KeepKind string

// Kept field kinds.
const (
	KeepCaption KeepKind = "caption" // the sample's text
	KeepKey     KeepKind = "key"     // a top-level key of the sample's JSON
	KeepPath    KeepKind = "path"    // a dotted path into the sample's JSON
)

// KeepField is one parsed --keep spec.
type KeepField struct {
	Name string   `json:"name"`
	Kind KeepKind `json:"kind"`
	Path string   `json:"path,omitempty"` // the key or the dotted path
}

// KeepType is the type of a kept field over the whole index.
type KeepType uint8

// Kept field types.
const (
	KeepString KeepType = iota
	KeepInt
	KeepFloat
)

func (t KeepType) String() string {
	switch t {
	case KeepInt:
		return "int64"
	case KeepFloat:
		return "float64"
	}
	return "string"
}

// KeepValue is one kept value: Text is a string's text or a number's JSON
// text (Num set); Valid is false when the value is missing.
type KeepValue struct {
	Text  string
	Num   bool
	Valid bool
}

// ParseKeep parses a --keep list ("url,json:label,caption"); "" gives nil.
func ParseKeep(spec string) ([]KeepField, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, nil
	}
	var out []KeepField
	seen := map[string]bool{}
	for _, s := range strings.Split(spec, ",") {
		f, err := parseKeepField(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		if seen[f.Name] {
			return nil, fmt.Errorf("%w: keep: column name %q twice in %q (rename one: name=field)", ErrInvalidConfig, f.Name, spec)
		}
		seen[f.Name] = true
		out = append(out, f)
	}
	return out, nil
}

func parseKeepField(s string) (KeepField, error) {
	name, field, renamed := strings.Cut(s, "=")
	if !renamed {
		field = s
	}
	var f KeepField
	switch path, isPath := strings.CutPrefix(field, "json:"); {
	case field == "caption":
		f = KeepField{Name: "caption", Kind: KeepCaption}
	case isPath:
		f = KeepField{Name: path, Kind: KeepPath, Path: path}
		if path == "" || strings.HasPrefix(path, ".") || strings.HasSuffix(path, ".") || strings.Contains(path, "..") {
			return f, fmt.Errorf("%w: keep: %q: want json:key or json:a.b", ErrInvalidConfig, s)
		}
	default:
		f = KeepField{Name: field, Kind: KeepKey, Path: field}
	}
	if renamed {
		f.Name = name
	}
	if err := checkKeepName(f.Name); err != nil {
		return f, fmt.Errorf("%w: keep: %q: %v", ErrInvalidConfig, s, err)
	}
	return f, nil
}

func checkKeepName(n string) error {
	if n == "" || len(n) > 64 {
		return fmt.Errorf("column name %q: want 1 to 64 bytes", n)
	}
	for _, r := range n {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return fmt.Errorf("column name %q: only A-Z a-z 0-9 _ . - allowed", n)
		}
	}
	return nil
}

// needsJSON reports whether any field reads the sample's JSON object.
func keepNeedsJSON(fs []KeepField) bool {
	for _, f := range fs {
		if f.Kind != KeepCaption {
			return true
		}
	}
	return false
}

// extractKeep returns the kept values of one sample from its JSON object
// (raw: a manifest line or a WebDataset .json member; nil when the source
// has none) and its caption.
func extractKeep(fields []KeepField, raw []byte, caption string) []KeepValue {
	out := make([]KeepValue, len(fields))
	var obj map[string]json.RawMessage
	if len(raw) > 0 && keepNeedsJSON(fields) {
		if json.Unmarshal(raw, &obj) != nil {
			obj = nil
		}
	}
	for i, f := range fields {
		switch f.Kind {
		case KeepCaption:
			out[i] = KeepValue{Text: clipKeep(caption), Valid: true}
		case KeepKey:
			out[i] = keepValueOf(obj[f.Path])
		case KeepPath:
			out[i] = keepValueOf(lookupPath(obj, f.Path))
		}
	}
	return out
}

// keepValueOf converts one raw JSON value.
func keepValueOf(m json.RawMessage) KeepValue {
	m = bytes.TrimSpace(m)
	if isNull(m) {
		return KeepValue{}
	}
	switch c := m[0]; {
	case c == '"':
		var s string
		if json.Unmarshal(m, &s) != nil {
			return KeepValue{}
		}
		return KeepValue{Text: clipKeep(s), Valid: true}
	case c == '-' || c >= '0' && c <= '9':
		var n json.Number
		if json.Unmarshal(m, &n) != nil {
			return KeepValue{}
		}
		return KeepValue{Text: n.String(), Num: true, Valid: true}
	}
	var buf bytes.Buffer // true, false, an object or an array: its compact text
	if json.Compact(&buf, m) != nil {
		return KeepValue{}
	}
	return KeepValue{Text: clipKeep(buf.String()), Valid: true}
}

// clipKeep repairs invalid UTF-8 and cuts s at MaxKeepBytes on a rune boundary.
func clipKeep(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= MaxKeepBytes {
		return s
	}
	n := MaxKeepBytes
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// typeOf is the narrowest type holding v (ok false for a missing value).
func typeOf(v KeepValue) (KeepType, bool) {
	switch {
	case !v.Valid:
		return 0, false
	case !v.Num:
		return KeepString, true
	}
	if _, err := strconv.ParseInt(v.Text, 10, 64); err == nil {
		return KeepInt, true
	}
	return KeepFloat, true
}

// keepTable holds the kept values of an index compactly: each entry's values
// encoded end to end in one string of the index's arena (a kind byte and a
// uvarint length per value), found by the entry's row (Entry.ref.keep).
type keepTable struct {
	fields  []KeepField
	rows    []string
	types   []KeepType
	typed   []bool  // a present value was seen
	missing []int64 // per field
	strs    stringArena
}

func newKeepTable(fields []KeepField) *keepTable {
	return &keepTable{fields: fields, types: make([]KeepType, len(fields)), typed: make([]bool, len(fields)),
		missing: make([]int64, len(fields))}
}

// add stores vals and returns the row's reference (1 + its row).
func (t *keepTable) add(vals []KeepValue) uint32 {
	var b []byte
	for i, v := range vals {
		kind := byte(0)
		if v.Valid {
			kind = 1
			if v.Num {
				kind = 2
			}
		}
		b = append(b, kind)
		b = binary.AppendUvarint(b, uint64(len(v.Text)))
		b = append(b, v.Text...)
		t.widen(i, v)
	}
	t.rows = append(t.rows, t.strs.add(unsafe.String(&b[0], len(b)))) // b is not reused
	return uint32(len(t.rows))
}

// widen folds v into field i's type and missing count.
func (t *keepTable) widen(i int, v KeepValue) {
	ty, ok := typeOf(v)
	switch {
	case !ok:
		t.missing[i]++
	case !t.typed[i]:
		t.types[i], t.typed[i] = ty, true
	case ty == KeepString || t.types[i] == KeepString:
		t.types[i] = KeepString
	case ty != t.types[i]:
		t.types[i] = KeepFloat // int and float
	}
}

// values decodes row ref (1 + row); nil for 0.
func (t *keepTable) values(ref uint32) []KeepValue {
	if ref == 0 || int(ref) > len(t.rows) {
		return nil
	}
	s := t.rows[ref-1]
	out := make([]KeepValue, 0, len(t.fields))
	for len(s) > 0 {
		kind := s[0]
		n, w := binary.Uvarint([]byte(s[1:min(len(s), 11)]))
		s = s[1+w:]
		out = append(out, KeepValue{Text: s[:n], Num: kind == 2, Valid: kind != 0})
		s = s[n:]
	}
	return out
}

// Keep returns the fields the index keeps (Options.Keep); nil when none.
func (ix *Index) Keep() []KeepField {
	if ix.keep == nil {
		return nil
	}
	return ix.keep.fields
}

// KeepTypes returns the type of each kept field over the index's entries.
func (ix *Index) KeepTypes() []KeepType {
	if ix.keep == nil {
		return nil
	}
	return append([]KeepType(nil), ix.keep.types...)
}

// KeepMissing returns, per kept field, how many of the index's entries lack it.
func (ix *Index) KeepMissing() []int64 {
	if ix.keep == nil {
		return nil
	}
	return append([]int64(nil), ix.keep.missing...)
}

// Kept returns entry e's kept values, one per Keep field; nil when the index
// keeps nothing or e is not one of its entries. The strings alias the index.
func (ix *Index) Kept(e Entry) []KeepValue {
	if ix.keep == nil {
		return nil
	}
	return ix.keep.values(e.ref.keep)
}
